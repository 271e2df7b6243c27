package shim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeEngine is an engine whose main process exits when the test says, or
// when it is stopped.
type fakeEngine struct {
	exit  chan error // its exit status, sent once
	stops atomic.Int32
	grace atomic.Int64 // the last stop's grace
	// stopExits makes Stop end the main process, as a real stop does.
	stopExits bool
	signals   chan syscall.Signal // those sent to it
}

func newFakeEngine(stopExits bool) *fakeEngine {
	return &fakeEngine{exit: make(chan error, 1), stopExits: stopExits, signals: make(chan syscall.Signal, 8)}
}

func (f *fakeEngine) Wait() error { return <-f.exit }

func (f *fakeEngine) Signal(sig syscall.Signal) error {
	f.signals <- sig
	return nil
}

func (f *fakeEngine) Stop(grace time.Duration) error {
	f.grace.Store(int64(grace))
	if f.stops.Add(1) == 1 && f.stopExits {
		f.exit <- errors.New("signal: terminated")
	}
	return nil
}

// shim is a running Serve and what the test drives it with.
type shim struct {
	path   string
	eng    *fakeEngine
	out    *io.PipeWriter // the engine's output
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve has returned
	err    error         // Serve's result, once done is closed
}

func startShim(t *testing.T, eng *fakeEngine, adopt time.Duration) *shim {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	r, w := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	s := &shim{path: path, eng: eng, out: w, cancel: cancel, done: make(chan struct{})}
	go func() {
		s.err = Serve(ctx, ln, 4242, eng, r, Options{AdoptTimeout: adopt, Lines: 3, Grace: 7 * time.Second, Fingerprint: "fp"})
		close(s.done)
	}()
	t.Cleanup(func() {
		cancel()
		w.Close()
		select {
		case eng.exit <- nil:
		default:
		}
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return s
}

func (s *shim) print(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(s.out, l+"\n"); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *shim) attach(t *testing.T) *Conn {
	t.Helper()
	c, err := Attach(s.path, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// next reads the next message, failing the test after a generous wait.
func next(t *testing.T, c *Conn) Message {
	t.Helper()
	type got struct {
		m   Message
		err error
	}
	ch := make(chan got, 1)
	go func() {
		m, err := c.Next()
		ch <- got{m, err}
	}()
	select {
	case g := <-ch:
		if g.err != nil {
			t.Fatalf("Next: %v", g.err)
		}
		return g.m
	case <-time.After(30 * time.Second):
		t.Fatal("no message from the shim")
	}
	return Message{}
}

func (s *shim) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	return nil
}

// An attached poold gets the hello with the lines printed before it came
// (those it never saw counted), then each line, then the exit; the shim
// leaves the rest of the engine to it.
func TestAttachedPooldGetsLinesThenExit(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	s.print(t, "one", "two", "three", "four")
	c := s.attach(t)
	// The shim takes the engine's output on a goroutine of its own: on a
	// busy machine the attach may come before it has taken some of the
	// lines, which then follow the hello as lines. Either way nothing is
	// lost, the backlog is the last 3 lines taken before the attach, and
	// all of them count as unseen.
	h := c.Hello
	got := h.Backlog
	for len(got) == 0 || got[len(got)-1] != "four" {
		m := next(t, c)
		if m.Kind != KindLine {
			t.Fatalf("got %+v before the line four", m)
		}
		got = append(got, m.Line)
	}
	all := []string{"one", "two", "three", "four"}
	tail := all[len(all)-min(len(got), len(all)):]
	if h.PID != 4242 || h.ShimPID != os.Getpid() || h.Fingerprint != "fp" || h.Protocol != Protocol ||
		len(got) < 3 || strings.Join(got, ",") != strings.Join(tail, ",") || len(h.Backlog) > 3 || h.Unseen != len(h.Backlog) {
		t.Fatalf("hello %+v, then lines up to four %q: want pid 4242, at most the last 3 lines in the backlog, all unseen, and nothing lost", h, got)
	}
	s.print(t, "five")
	if m := next(t, c); m.Kind != KindLine || m.Line != "five" {
		t.Fatalf("got %+v, want line five", m)
	}
	s.print(t, "last words")
	s.out.Close()
	s.eng.exit <- errors.New("exit status 3")
	if m := next(t, c); m.Line != "last words" {
		t.Fatalf("got %+v, want the last line before the exit", m)
	}
	if m := next(t, c); m.Kind != KindExit || m.Status != "exit status 3" {
		t.Fatalf("got %+v, want the exit", m)
	}
	if err := s.wait(t); err == nil || err.Error() != "exit status 3" {
		t.Fatalf("Serve returned %v", err)
	}
	if n := s.eng.stops.Load(); n != 0 {
		t.Fatalf("the engine was stopped %d times: the attached poold cleans up after it", n)
	}
}

// A shim to which no poold attaches within the adopt timeout stops its
// engine and ends; a poold coming later finds nothing to attach to.
func TestNoPooldStopsTheEngine(t *testing.T) {
	s := startShim(t, newFakeEngine(true), 50*time.Millisecond)
	if err := s.wait(t); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("Serve returned %v, want the stopped engine's status", err)
	}
	if n := s.eng.stops.Load(); n < 1 {
		t.Fatal("the engine was not stopped")
	}
	if _, err := Attach(s.path, time.Second); err == nil {
		t.Fatal("a poold attached to a shim that stopped")
	}
}

// A poold that goes (a restart) starts the adopt timeout; one that comes
// back within it keeps the engine, and gets what it printed meanwhile. One
// that does not come back gets it stopped.
func TestDetachAndAdopt(t *testing.T) {
	s := startShim(t, newFakeEngine(true), time.Minute)
	c := s.attach(t)
	s.print(t, "seen")
	if m := next(t, c); m.Line != "seen" {
		t.Fatalf("got %+v", m)
	}
	c.Close()
	s.print(t, "while away")
	c = s.attach(t)
	// The line printed while no poold was attached is counted unseen; the
	// one the first poold got may be counted too, when its writer had not
	// yet marked it written (a line shown twice, never one lost). The shim
	// may take "while away" just after the attach: it then follows the
	// hello.
	h := c.Hello
	got, unseen := strings.Join(h.Backlog, ","), 1 // the unseen the backlog must count, at least
	if got == "seen" {
		unseen = 0
		if m := next(t, c); m.Kind == KindLine {
			got += "," + m.Line
		}
	}
	if got != "seen,while away" || h.Unseen < unseen || h.Unseen > unseen+1 {
		t.Fatalf("hello %+v (then %q): want both lines, the second unseen", h, got)
	}
	if n := s.eng.stops.Load(); n != 0 {
		t.Fatalf("the engine was stopped %d times while a poold came back in time", n)
	}

	s2 := startShim(t, newFakeEngine(true), 100*time.Millisecond)
	s2.attach(t).Close()
	s2.wait(t)
	if n := s2.eng.stops.Load(); n < 1 {
		t.Fatal("the engine outlived the adopt timeout after its poold went")
	}
}

// A second poold that attaches replaces the first, whose connection ends.
func TestSecondAttachReplacesFirst(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	first := s.attach(t)
	second := s.attach(t)
	s.print(t, "to the second")
	if m := next(t, second); m.Line != "to the second" {
		t.Fatalf("got %+v", m)
	}
	if _, err := first.Next(); err == nil {
		t.Fatal("the replaced poold is still attached")
	}
}

// An engine that exits while no poold is attached has what it left ended
// by the shim.
func TestExitWhileDetachedEndsTheRest(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	s.out.Close()
	s.eng.exit <- errors.New("signal: killed")
	s.wait(t)
	if n := s.eng.stops.Load(); n != 1 {
		t.Fatalf("stopped %d times, want once", n)
	}
}

// A signalled shim stops its engine, attached poold or not, and tells it.
func TestSignalStopsTheEngine(t *testing.T) {
	s := startShim(t, newFakeEngine(true), time.Minute)
	c := s.attach(t)
	s.cancel()
	if m := next(t, c); m.Kind != KindExit || m.Status != "signal: terminated" {
		t.Fatalf("got %+v, want the exit", m)
	}
	s.wait(t)
}

// A poold that reads nothing never holds the engine up: its output is read
// on, and the poold learns, once it reads, how many lines it lost.
func TestSlowPooldLosesLinesNotTheEngine(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	c := s.attach(t)
	n := queueLen * 64 // far beyond the queue and the socket's buffers
	line := strings.Repeat("x", 200)
	printed := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := fmt.Fprintf(s.out, "%d %s\n", i, line); err != nil {
				printed <- err
				return
			}
		}
		printed <- nil
	}()
	select {
	case err := <-printed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the engine's output blocked while poold did not read")
	}
	got, dropped := 0, false
	for !dropped {
		m := next(t, c)
		if strings.Contains(m.Line, "lines of the engine's output dropped") {
			dropped = true
			continue
		}
		got++
	}
	if got >= n {
		t.Fatalf("read %d lines of %d and a drop notice", got, n)
	}
}

// An engine that could not start is reported to the poold that attaches.
func TestFailIsAStartError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go Fail(ln, errors.New(`fork/exec /opt/vllm: permission denied`), 30*time.Second)
	_, err = Attach(path, 30*time.Second)
	var se *StartError
	if !errors.As(err, &se) || se.Status != "fork/exec /opt/vllm: permission denied" {
		t.Fatalf("Attach: %v, want the start error", err)
	}
}

// A shim of another protocol version is not attached to.
func TestAttachRefusesOtherProtocol(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = writeMessage(c, Message{Kind: KindHello, Protocol: Protocol + 1, PID: 1})
			c.Close()
		}
	}()
	var pe *ProtocolError
	if _, err := Attach(path, 30*time.Second); !errors.As(err, &pe) || pe.Shim != Protocol+1 {
		t.Fatalf("Attach: %v, want a protocol error", err)
	}
}

func TestReadLine(t *testing.T) {
	long := strings.Repeat("p", 3*MaxLine+5)
	in := "short\r\n" + long + "\n" + "x" + long + "\r\n" + "\n" + "last, unterminated"
	br := bufio.NewReaderSize(strings.NewReader(in), MaxLine)
	want := []string{
		"short",
		long[:MaxLine] + " … [line truncated: " + strconv.Itoa(2*MaxLine+5) + " more bytes]",
		("x" + long)[:MaxLine] + " … [line truncated: " + strconv.Itoa(2*MaxLine+6) + " more bytes]",
		"",
		"last, unterminated",
	}
	for i, w := range want {
		line, err := ReadLine(br)
		if line != w || (err != nil) != (i == len(want)-1) {
			t.Fatalf("line %d: %.60q… (%d bytes), %v; want %.60q… (%d bytes)", i, line, len(line), err, w, len(w))
		}
	}
	if line, err := ReadLine(br); line != "" || err != io.EOF {
		t.Fatalf("after the end: %q, %v", line, err)
	}
}

// A fingerprint changes with any element of the command or the
// environment, and with where one list ends and the other starts.
func TestFingerprint(t *testing.T) {
	base := Fingerprint([]string{"vllm", "serve", "m"}, []string{"A=1"})
	for _, other := range [][2][]string{
		{{"vllm", "serve", "n"}, {"A=1"}},
		{{"vllm", "serve", "m"}, {"A=2"}},
		{{"vllm", "serve", "m", "A=1"}, nil},
		{{"vllm", "serve"}, {"m", "A=1"}},
		{{"vllm", "servem"}, {"A=1"}},
	} {
		if Fingerprint(other[0], other[1]) == base {
			t.Errorf("%q %q: same fingerprint as the base", other[0], other[1])
		}
	}
	if Fingerprint([]string{"vllm", "serve", "m"}, []string{"A=1"}) != base {
		t.Error("the same command and environment gave another fingerprint")
	}
}

// A poold that stops reading, its queue and socket full, while the engine
// exits does not hold the shim: the exit cannot reach it, so the shim
// closes the connection and ends, and the poold, reading again, finds the
// connection gone rather than waiting for an exit forever.
func TestStalledPooldDoesNotHoldTheExit(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	c := s.attach(t)
	line := strings.Repeat("x", 200)
	for i := range queueLen * 64 { // far beyond the queue and the socket's buffers
		if _, err := fmt.Fprintf(s.out, "%d %s\n", i, line); err != nil {
			t.Fatal(err)
		}
	}
	s.out.Close()
	s.eng.exit <- errors.New("signal: killed")
	select {
	case <-s.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Serve did not return while its poold read nothing")
	}
	if s.err == nil || s.err.Error() != "signal: killed" {
		t.Fatalf("Serve returned %v, want the engine's exit", s.err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if m, err := c.Next(); err != nil || m.Kind == KindExit {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the exit reached a poold that read nothing for longer than the shim waits")
		}
	case <-time.After(time.Minute):
		t.Fatal("the connection outlived the shim's Serve")
	}
}

// poold asks its shim: the engine's state, a signal to it, and its stop,
// whose grace is poold's or, when poold gives none, the shim's own; the
// exit follows the stop.
func TestRequests(t *testing.T) {
	s := startShim(t, newFakeEngine(true), time.Minute)
	c := s.attach(t)
	go func() { // Next takes the lines and the exit, as poold's follower does
		for {
			if _, err := c.Next(); err != nil {
				return
			}
		}
	}()
	st, err := c.State(30 * time.Second)
	if err != nil || st.PID != 4242 || !st.Running || st.Stopping {
		t.Fatalf("State: %+v, %v; want pid 4242 running", st, err)
	}
	if err := c.Signal(syscall.SIGUSR1, 30*time.Second); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if sig := <-s.eng.signals; sig != syscall.SIGUSR1 {
		t.Fatalf("the engine got %v, want SIGUSR1", sig)
	}
	if err := c.Signal(0, 30*time.Second); err == nil || !strings.Contains(err.Error(), "no signal 0") {
		t.Fatalf("Signal(0): %v, want it refused", err)
	}
	if _, err := c.call(Request{Op: "pause"}, 30*time.Second); err == nil || !strings.Contains(err.Error(), `unknown request "pause"`) {
		t.Fatalf("an unknown request: %v, want it refused", err)
	}
	if err := c.Stop(3*time.Second, 30*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.wait(t); err == nil || err.Error() != "signal: terminated" {
		t.Fatalf("Serve returned %v, want the stopped engine's exit", err)
	}
	if g := time.Duration(s.eng.grace.Load()); g != 3*time.Second {
		t.Fatalf("stopped with grace %s, want poold's 3s", g)
	}

	s2 := startShim(t, newFakeEngine(true), time.Minute)
	c2 := s2.attach(t)
	go func() {
		for {
			if _, err := c2.Next(); err != nil {
				return
			}
		}
	}()
	if err := c2.Stop(-1, 30*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	s2.wait(t)
	if g := time.Duration(s2.eng.grace.Load()); g != 7*time.Second {
		t.Fatalf("stopped with grace %s, want the shim's own 7s", g)
	}
}

// A poold whose shim is gone gets an error from a request, not a hang.
func TestRequestToAGoneShim(t *testing.T) {
	s := startShim(t, newFakeEngine(false), time.Minute)
	c := s.attach(t)
	s.out.Close()
	s.eng.exit <- nil
	if m := next(t, c); m.Kind != KindExit {
		t.Fatalf("got %+v, want the exit", m)
	}
	s.wait(t)
	if _, err := c.State(30 * time.Second); err == nil {
		t.Fatal("State answered by a shim that ended")
	}
}
