// Package rdbtest starts a private redis-server for a test: on a free
// loopback port, in the test's temporary directory, saving nothing, and
// stopped when the test ends. Never a system Redis.
package rdbtest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Start runs redis-server for t and returns its URL (redis://127.0.0.1:PORT).
// Without redis-server on PATH the test is skipped, or fails when the
// environment sets REQUIRE_TOOLS=1 (as CI does).
func Start(t testing.TB) string { return Run(t).URL }

// Server is a redis-server that a test may stop and start again on the same
// port (an outage and its end). Its methods are for the test's goroutine.
type Server struct {
	// URL is redis://127.0.0.1:PORT, the same across restarts.
	URL string

	t      testing.TB
	bin    string
	dir    string
	port   int
	cmd    *exec.Cmd  // nil while stopped
	exited chan error // cmd's Wait
}

// Run is Start, returning the server so that the test may stop it.
func Run(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("REQUIRE_TOOLS") == "1" {
			t.Fatal("redis-server is not installed (apt-get install redis-server)")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), port: freePort(t)}
	s.URL = "redis://" + s.addr()
	t.Cleanup(s.Stop)
	s.Start()
	return s
}

func (s *Server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Start starts the server (again) and returns once it answers PING; the
// data of a stopped server is gone.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "yes", "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for !ping(s.addr()) {
		select {
		case err := <-exited:
			s.cmd = nil
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatal("redis-server did not answer within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server and waits for it to exit; a stopped server stays
// stopped.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause stops the server with SIGSTOP: it accepts connections (the kernel
// does) but answers nothing, as a stalled Redis; Resume (SIGCONT) lets it
// go on. A paused server is resumed when the test ends.
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("pausing a stopped redis-server")
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pausing redis-server: %v", err)
	}
	cmd := s.cmd
	s.t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT) })
}

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if s.cmd != nil {
		if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			s.t.Fatalf("resuming redis-server: %v", err)
		}
	}
}

// ping reports whether a Redis at addr answers PING.
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprint(c, "PING\r\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
