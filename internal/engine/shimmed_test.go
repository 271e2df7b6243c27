package engine

import (
	"encoding/json"
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

// handle attaches to f as poold does to the shim of an engine it adopts,
// and follows it.
func (f *fakeShim) handle(t *testing.T) *Shimmed {
	t.Helper()
	var sup Supervisor
	h, err := sup.Adopt(LedgerEngine{PID: f.eng.Process.Pid, Token: "fake-token", Shim: f.path}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, h.Output()) }()
	return h
}

// poold stops an engine under a shim by asking the shim, with the
// profile's grace, while the engine still runs: poold signals nothing the
// shim holds.
func TestStopGoesThroughTheShim(t *testing.T) {
	f := startFakeShim(t, false)
	h := f.handle(t)
	if err := h.Stop(3*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
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
	h := f.handle(t)
	select {
	case <-h.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the dropped connection went unnoticed")
	}
	if !h.lost.Load() || h.Err() == nil || !strings.Contains(h.Err().Error(), "its supervisor (poold engine-shim) is gone") {
		t.Fatalf("exit %v (lost: %v); want the lost supervisor", h.Err(), h.lost.Load())
	}
	if !alive(f.eng.Process.Pid) {
		t.Fatal("the engine died with the connection")
	}
	if err := h.Stop(3*time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
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
	ledger, err := OpenLedger(filepath.Dir(f.path), nil, StopOrphan, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	pid := f.eng.Process.Pid
	st, err := ProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := ledger.ReapEngines([]LedgerEngine{{Pool: "gone", Profile: "m", PID: pid, PGID: pid, StartTicks: st.Start, Token: "fake-token", Shim: f.path}}, 3*time.Second)
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
	h := f.handle(t)
	hurry := make(chan struct{})
	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(time.Hour, hurry, slog.New(slog.DiscardHandler)) }()
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
