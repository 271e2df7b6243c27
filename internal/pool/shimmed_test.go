package pool

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/shim"
)

// fakeShim serves a shim's socket for a real process, the engine: it says
// hello (in protocol, if set), passes each request to the test, and on a
// stop (with slow, on a SIGKILL only) ends the engine itself and reports
// the exit. With drop, it closes its first connection right after the
// hello, reporting nothing.
type fakeShim struct {
	path     string
	eng      *exec.Cmd
	drop     bool
	slow     bool
	protocol int
	// asked has each request and whether the engine was alive when it came.
	asked chan askedShim
}

type askedShim struct {
	r     shim.Request
	alive bool
}

func startFakeShim(t *testing.T, drop bool) *fakeShim {
	t.Helper()
	return startFakeShimWith(t, &fakeShim{drop: drop, protocol: shim.Protocol})
}

func startFakeShimWith(t *testing.T, f *fakeShim) *fakeShim {
	t.Helper()
	eng := exec.Command("sleep", "600")
	eng.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := eng.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = eng.Wait(); close(waited) }()
	t.Cleanup(func() { _ = eng.Process.Kill(); <-waited })
	f.path, f.eng, f.asked = filepath.Join(realTempDir(t), "engine-fake.sock"), eng, make(chan askedShim, 16)
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			enc := json.NewEncoder(c)
			_ = enc.Encode(shim.Message{Kind: shim.KindHello, Protocol: f.protocol, PID: eng.Process.Pid, ShimPID: os.Getpid(), Grace: time.Second})
			if first && f.drop {
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				dec := json.NewDecoder(c)
				for {
					var r shim.Request
					if dec.Decode(&r) != nil {
						return
					}
					f.asked <- askedShim{r, alive(eng.Process.Pid)}
					_ = enc.Encode(shim.Message{Kind: shim.KindReply, ID: r.ID})
					if r.Op == shim.OpStop && !f.slow || r.Op == shim.OpSignal && r.Signal == int(syscall.SIGKILL) {
						_ = eng.Process.Kill()
						<-waited
						_ = enc.Encode(shim.Message{Kind: shim.KindExit, Status: "signal: killed"})
						return
					}
				}
			}()
		}
	}()
	return f
}

// engine attaches to f as poold does to the shim of an engine it
// started, and follows it.
func (f *fakeShim) engine(t *testing.T) *engine {
	t.Helper()
	c, err := shim.Attach(f.path, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{
		profile:  &profile.Profile{ID: "m"},
		pid:      f.eng.Process.Pid,
		token:    "fake-token",
		shimPath: f.path,
		conn:     c,
		exited:   make(chan struct{}),
		pumped:   make(chan struct{}),
		logs:     proc.NewOutput(logLines),
	}
	out, wait := e.follow(slog.New(slog.DiscardHandler))
	go func() { _, _ = io.Copy(io.Discard, out) }()
	go func() {
		e.exitErr = wait()
		close(e.exited)
	}()
	return e
}

// poold stops an engine under a shim by asking the shim, with the
// profile's grace, while the engine still runs: poold signals nothing the
// shim holds.
func TestStopGoesThroughTheShim(t *testing.T) {
	f := startFakeShim(t, false)
	e := f.engine(t)
	if err := e.stop(3*time.Second, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case a := <-f.asked:
		if a.r.Op != shim.OpStop || a.r.Grace != 3*time.Second || !a.alive {
			t.Fatalf("the shim was asked %+v (engine alive: %v); want a stop with grace 3s of a running engine", a.r, a.alive)
		}
	default:
		t.Fatal("the shim was not asked to stop its engine")
	}
	if alive(f.eng.Process.Pid) {
		t.Fatal("the engine runs on after its stop")
	}
}

// A connection to a shim that drops is the engine's failure, and its stop
// goes through a new connection to the shim, which still runs it.
func TestStopAfterTheShimConnectionDropped(t *testing.T) {
	f := startFakeShim(t, true)
	e := f.engine(t)
	select {
	case <-e.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the dropped connection went unnoticed")
	}
	if !e.lost.Load() || e.exitErr == nil || !strings.Contains(e.exitErr.Error(), "its supervisor (poold engine-shim) is gone") {
		t.Fatalf("exit %v (lost: %v); want the lost supervisor", e.exitErr, e.lost.Load())
	}
	if !alive(f.eng.Process.Pid) {
		t.Fatal("the engine died with the connection")
	}
	if err := e.stop(3*time.Second, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case a := <-f.asked:
		if a.r.Op != shim.OpStop || !a.alive {
			t.Fatalf("the shim was asked %+v (engine alive: %v); want a stop of a running engine", a.r, a.alive)
		}
	default:
		t.Fatal("the shim was not asked again to stop its engine")
	}
	if alive(f.eng.Process.Pid) {
		t.Fatal("the engine runs on after its stop")
	}
}

// The reap of engines that no pool took (poold stop-engines, a pool
// removed while poold was down) stops each through its shim, while it still
// runs, with the reap's grace.
func TestReapGoesThroughTheShim(t *testing.T) {
	f := startFakeShim(t, false)
	ledger, err := proc.OpenLedger(filepath.Dir(f.path), nil, StopOrphan, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	pid := f.eng.Process.Pid
	st, err := proc.ProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := ledger.ReapEngines([]proc.LedgerEngine{{Pool: "gone", Profile: "m", PID: pid, PGID: pid, StartTicks: st.Start, Token: "fake-token", Shim: f.path}}, 3*time.Second)
	if err != nil {
		t.Fatalf("ReapEngines: %v", err)
	}
	select {
	case a := <-f.asked:
		if a.r.Op != shim.OpStop || a.r.Grace != 3*time.Second || !a.alive {
			t.Fatalf("the shim was asked %+v (engine alive: %v); want a stop with grace 3s of a running engine", a.r, a.alive)
		}
	default:
		t.Fatal("the shim was not asked to stop its engine")
	}
	if alive(pid) || len(stopped) != 1 || stopped[0] != pid {
		t.Fatalf("stopped %v (engine alive: %v), want the engine %d stopped", stopped, alive(pid), pid)
	}
}

// A stop hurried (a second shutdown signal) asks the shim for SIGKILL, and
// ends once the shim reports the exit, long before the grace.
func TestHurriedStopGoesThroughTheShim(t *testing.T) {
	f := startFakeShimWith(t, &fakeShim{slow: true, protocol: shim.Protocol})
	e := f.engine(t)
	hurry := make(chan struct{})
	e.hurry = hurry
	stopped := make(chan error, 1)
	go func() { stopped <- e.stop(time.Hour, slog.New(slog.DiscardHandler)) }()
	if a := <-f.asked; a.r.Op != shim.OpStop || a.r.Grace != time.Hour {
		t.Fatalf("the shim was asked %+v first, want the stop", a.r)
	}
	close(hurry)
	select {
	case a := <-f.asked:
		if a.r.Op != shim.OpSignal || a.r.Signal != int(syscall.SIGKILL) {
			t.Fatalf("the shim was asked %+v once hurried, want SIGKILL", a.r)
		}
	case <-time.After(time.Minute):
		t.Fatal("the hurried stop asked the shim nothing")
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the hurried stop did not end with the engine")
	}
}

// An engine left by an older poold, whose shim speaks another protocol, is
// not adopted, and the reason says why; it is left to the reap.
func TestAdoptRefusesAnOlderShim(t *testing.T) {
	f := startFakeShimWith(t, &fakeShim{protocol: 1})
	dir := filepath.Dir(f.path)
	pid := f.eng.Process.Pid
	st, err := proc.ProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	writeRecords(t, dir, proc.LedgerEngine{Pool: "g", Profile: "a", PID: pid, PGID: pid, StartTicks: st.Start, Token: "fake-token", Shim: f.path})
	s, rest, _ := keptSet(t, dir, reloadConfig(t, `{"name": "g", "gpus": [0]}`, simProfile("a", []string{"g"})))
	if len(rest) != 1 || rest[0].PID != pid {
		t.Fatalf("left to the reap: %+v, want the engine of the older shim", rest)
	}
	want := fmt.Sprintf("its supervisor is of an older or newer poold (protocol 1; this poold speaks %d)", shim.Protocol)
	if ad := s.Pool("g").Status().Adoption; len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, want) {
		t.Fatalf("adoption %+v, want a refusal saying %q", ad, want)
	}
}
