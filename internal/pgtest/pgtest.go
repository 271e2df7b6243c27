// Package pgtest runs a throwaway PostgreSQL server for tests: initdb in a
// temporary directory, postgres on a free loopback port, both as a user
// other than root (PostgreSQL refuses root; CI runs as root, so the server
// then runs as "nobody", or a system user it creates). It is test support,
// imported only by tests.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequireEnv, set to 1, makes a missing PostgreSQL a failure instead of a
// skip (CI sets it).
const RequireEnv = "POOLD_REQUIRE_POSTGRES"

// Server is one running PostgreSQL. Stop and Start may be called in turn to
// take it away and bring it back on the same port with the same data.
type Server struct {
	t    testing.TB
	bin  string // the directory of initdb and postgres
	dir  string // the data directory
	port int
	cred *syscall.Credential // nil when the test does not run as root
	log  *lockedBuffer       // the server's output

	mu     sync.Mutex // guards cmd and exited
	cmd    *exec.Cmd
	exited chan struct{}
}

// binDir finds the directory of initdb and postgres: $PATH, else Debian's
// /usr/lib/postgresql/*/bin, the newest first.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "postgres")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no initdb and postgres found (apt-get install postgresql)")
}

// Start initialises a database cluster and starts PostgreSQL on it; the
// test skips when PostgreSQL is not installed, unless RequireEnv is set.
// The server is stopped and its files removed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%v, and %s=1", err, RequireEnv)
		}
		t.Skip(err)
	}
	s := &Server{t: t, bin: bin, log: &lockedBuffer{}}
	root, err := os.MkdirTemp("", "poold-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	s.dir = filepath.Join(root, "data")
	if os.Geteuid() == 0 {
		uid, gid, err := serverUser()
		if err != nil {
			t.Fatal(err)
		}
		s.cred = &syscall.Credential{Uid: uid, Gid: gid}
		if err := os.Chown(root, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
	}
	initdb := s.command(filepath.Join(bin, "initdb"), "-D", s.dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	s.port = freePort(t)
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// serverUser is the user the server runs as under root: nobody, else a
// system user created for it.
func serverUser() (uid, gid uint32, err error) {
	u, err := user.Lookup("nobody")
	if err != nil {
		const name = "poold-pgtest"
		if u, err = user.Lookup(name); err != nil {
			if out, err := exec.Command("useradd", "--system", "--no-create-home", name).CombinedOutput(); err != nil {
				return 0, 0, fmt.Errorf("useradd %s: %v: %s", name, err, out)
			}
			if u, err = user.Lookup(name); err != nil {
				return 0, 0, err
			}
		}
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, err
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return 0, 0, err
	}
	return uint32(id), uint32(g), nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = filepath.Dir(s.dir)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = dieWithParent(&syscall.SysProcAttr{Credential: s.cred})
	return cmd
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// DSN is the connection string of the server's postgres database.
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Start starts the server (again) and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	cmd := s.command(filepath.Join(s.bin, "postgres"), "-D", s.dir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off")
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Connections are accepted, and refused, while the server starts up.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			_ = c.Close(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			s.t.Fatalf("postgres exited at start:\n%s", s.log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("postgres accepts no connection after 60 s:\n%s", s.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down (fast shutdown: clients are disconnected) and
// waits for it to exit; it does nothing when the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// lockedBuffer is a bytes.Buffer that the server writes while a test may
// read it.
type lockedBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
