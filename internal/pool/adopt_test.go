package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/shim"
	"github.com/poold/poold/internal/statusapi"
)

// keptSet runs a Set whose engines run under shims, with its ledger in
// dir, until stop is called: with detach, it lets go of its engines, as a
// poold that stops with keep-engines-on-restart; without, it stops them.
// Before Run, it adopts what the ledger recorded and returns what it did
// not attach to.
func keptSet(t *testing.T, dir string, cfg *profile.Config) (s *Set, rest []proc.LedgerEngine, stop func(detach bool)) {
	t.Helper()
	return keptSetWith(t, dir, cfg, nil)
}

// keptSetWith is keptSet with vllm, the launcher of the profiles without a
// command, followed by --model and the rest (Launch.VLLM).
func keptSetWith(t *testing.T, dir string, cfg *profile.Config, vllm []string) (s *Set, rest []proc.LedgerEngine, stop func(detach bool)) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := proc.OpenLedger(dir, nil, proc.StopOrphan, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s = NewSet(cfg, Options{Launch: profile.Launch{Self: self, VLLM: vllm}, Ledger: ledger, Shims: &proc.Shims{Dir: dir, AdoptTimeout: time.Minute}})
	recorded, err := ledger.Recorded()
	if err != nil {
		t.Fatal(err)
	}
	rest = s.Adopt(context.Background(), recorded)
	ctx, cancel := context.WithCancel(context.Background())
	s.Run(ctx)
	stopped := false
	stop = func(detach bool) {
		if stopped {
			return
		}
		stopped = true
		if detach {
			s.Detach()
		}
		cancel()
		s.Wait()
		ledger.Close()
	}
	t.Cleanup(func() { stop(false) })
	return s, rest, stop
}

// A Set that detaches leaves its engine running under its shim, and the
// next Set adopts it: the same process serves, with no load.
func TestAdoptKeepsTheEngine(t *testing.T) {
	dir := t.TempDir()
	cfg := reloadConfig(t, `{"name": "g", "gpus": [0], "default": "a"}`, simProfile("a", []string{"g"}))
	s1, _, stop1 := keptSet(t, dir, cfg)
	pid := waitFor(t, s1, "g", "a ready", func(p statusapi.Pool) bool { return p.State == StateReady.String() && p.Engine != nil }).Engine.PID
	stop1(true)
	if !alive(pid) {
		t.Fatalf("the engine %d did not outlive the detached Set", pid)
	}

	s2, rest, stop2 := keptSet(t, dir, cfg)
	if len(rest) != 0 {
		t.Fatalf("not attached: %+v", rest)
	}
	st := s2.Pool("g").Status()
	if st.State != StateReady.String() || st.Engine == nil || st.Engine.PID != pid || len(st.Adoption) != 1 || !st.Adoption[0].Adopted {
		t.Fatalf("status after the adoption: %+v, want engine %d ready and adopted", st, pid)
	}
	stop2(false)
	for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if alive(pid) {
		t.Fatalf("the adopted engine %d outlived the Set that stopped", pid)
	}
}

// Each verification step refuses the engine it finds wrong: the engine is
// stopped (its process gone) and /status says why.
func TestAdoptRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		// flags are the engine's flags before the restart.
		flags []string
		// between changes what the next Set finds: the profile it runs
		// (flags of the engine after the restart), the record, the host.
		between func(t *testing.T, port int, rec *proc.LedgerEngine) (after []string)
		want    string
	}{
		{
			name: "changed profile",
			between: func(*testing.T, int, *proc.LedgerEngine) []string {
				return []string{"--sim-ttft", "1ms"}
			},
			want: "profile changed while poold was down, or the vllm-command setting did: argument --sim-ttft added",
		},
		{
			name:  "port shared",
			flags: []string{"--sim-reuseport"},
			between: func(t *testing.T, port int, _ *proc.LedgerEngine) []string {
				lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
					var err error
					if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); cerr != nil {
						return cerr
					}
					return err
				}}
				ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(port))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				return []string{"--sim-reuseport"}
			},
			want: "another process listens",
		},
		{
			name: "recorded asleep",
			between: func(_ *testing.T, _ int, rec *proc.LedgerEngine) []string {
				rec.Sleeping = 1
				return nil
			},
			want: "GET /is_sleeping",
		},
		{
			name: "other process",
			between: func(_ *testing.T, _ int, rec *proc.LedgerEngine) []string {
				rec.StartTicks++
				return nil
			},
			want: "is gone",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			prof := func(flags []string) string {
				return simProfile("a", []string{"g"}, append([]string{"--enable-sleep-mode"}, flags...)...)
			}
			sleepy := func(p string) string { // sleep mode on: /is_sleeping answers
				return strings.Replace(p, `"id":"a"`, `"id":"a","sleep":{"level":1},"env":{"VLLM_SERVER_DEV_MODE":"1"}`, 1)
			}
			cfg := reloadConfig(t, `{"name": "g", "gpus": [0], "default": "a"}`, sleepy(prof(tt.flags)))
			s1, _, stop1 := keptSet(t, dir, cfg)
			eng := waitFor(t, s1, "g", "a ready", func(p statusapi.Pool) bool { return p.State == StateReady.String() && p.Engine != nil }).Engine
			stop1(true)

			l, err := proc.OpenLedger(dir, nil, proc.StopOrphan, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			recs, err := l.Recorded()
			if err != nil || len(recs) != 1 {
				t.Fatalf("recorded: %+v, %v", recs, err)
			}
			after := tt.between(t, eng.Port, &recs[0])
			l.Close()
			writeRecords(t, dir, recs...)

			cfg2 := reloadConfig(t, `{"name": "g", "gpus": [0], "default": "a"}`, sleepy(prof(after)))
			s2, rest, _ := keptSet(t, dir, cfg2)
			if len(rest) != 0 {
				t.Fatalf("not attached: %+v", rest)
			}
			ad := s2.Pool("g").Status().Adoption
			if len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, tt.want) {
				t.Fatalf("adoption %+v, want a refusal saying %q", ad, tt.want)
			}
			if alive(eng.PID) {
				t.Fatalf("the refused engine %d still runs", eng.PID)
			}
			waitFor(t, s2, "g", "a fresh engine", func(p statusapi.Pool) bool {
				return p.State == StateReady.String() && p.Engine != nil && p.Engine.PID != eng.PID
			})
		})
	}
}

// The launcher of a profile without a command is part of what the engine
// was started with: the next poold adopts the engine under the same
// launcher, and refuses it, naming the setting, under another.
func TestAdoptRefusesAnotherLauncher(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := reloadConfig(t, `{"name": "g", "gpus": [0], "default": "a"}`, `{"id": "a", "model": "org/a"}`)
	launcher := []string{self, "engine-sim"}
	s1, _, stop1 := keptSetWith(t, dir, cfg, launcher)
	pid := waitFor(t, s1, "g", "a ready", func(p statusapi.Pool) bool { return p.State == StateReady.String() && p.Engine != nil }).Engine.PID
	stop1(true)

	s2, _, stop2 := keptSetWith(t, dir, cfg, launcher)
	if ad := s2.Pool("g").Status().Adoption; len(ad) != 1 || !ad[0].Adopted {
		t.Fatalf("adoption under the same launcher: %+v", ad)
	}
	stop2(true)

	s3, rest, _ := keptSetWith(t, dir, cfg, append(launcher, "--sim-ttft", "1ms"))
	if len(rest) != 0 {
		t.Fatalf("not attached: %+v", rest)
	}
	if ad := s3.Pool("g").Status().Adoption; len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, "vllm-command") {
		t.Fatalf("adoption under another launcher: %+v, want a refusal naming vllm-command", ad)
	}
	if alive(pid) {
		t.Fatalf("the refused engine %d still runs", pid)
	}
	waitFor(t, s3, "g", "a fresh engine", func(p statusapi.Pool) bool {
		return p.State == StateReady.String() && p.Engine != nil && p.Engine.PID != pid
	})
}

// An engine that is not adopted because its process is not the recorded
// one is stopped through its shim, by a SIGTERM to the pid that the shim's
// hello gives; a shim pid of another user's process is not signalled. The
// shim here is a fake one, serving that hello from the state directory.
func TestAdoptSignalsOnlyPooldsShims(t *testing.T) {
	needRoot(t)
	victim := exec.Command("sleep", "60")
	victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := victim.Start(); err != nil {
		t.Skipf("cannot start a process as uid %d: %v", nobody, err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })

	dir := realTempDir(t)
	sock := filepath.Join(dir, "engine-fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	served := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close(); <-served })
	gone := exitedPID(t)
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = json.NewEncoder(c).Encode(shim.Message{Kind: shim.KindHello, Protocol: shim.Protocol, PID: gone, ShimPID: victim.Process.Pid})
		// Like a shim, report the exit once the "engine" is gone.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for alive(victim.Process.Pid) {
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	writeRecords(t, dir, proc.LedgerEngine{Pool: "g", Profile: "a", PID: gone, PGID: gone, StartTicks: 1, Shim: sock})

	s, rest, _ := keptSet(t, dir, reloadConfig(t, `{"name": "g", "gpus": [0]}`, simProfile("a", []string{"g"})))
	if len(rest) != 0 {
		t.Fatalf("not attached: %+v", rest)
	}
	if ad := s.Pool("g").Status().Adoption; len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, "is gone") {
		t.Fatalf("adoption %+v, want a refusal saying it is gone", ad)
	}
	if !alive(victim.Process.Pid) {
		t.Fatalf("the process %d of uid %d, named as the shim's pid, was signalled", victim.Process.Pid, nobody)
	}
}

// An engine left by an older poold, whose shim speaks another protocol, is
// not adopted, and the reason says why; it is left to the reap. The shim
// here is a fake one, which says hello in protocol 1 for a real process.
func TestAdoptRefusesAnOlderShim(t *testing.T) {
	eng := exec.Command("sleep", "600")
	eng.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := eng.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Process.Kill(); _ = eng.Wait() })
	dir := realTempDir(t)
	sock := filepath.Join(dir, "engine-fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pid := eng.Process.Pid
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = json.NewEncoder(c).Encode(shim.Message{Kind: shim.KindHello, Protocol: 1, PID: pid, ShimPID: os.Getpid(), Grace: time.Second})
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	st, err := proc.ProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	writeRecords(t, dir, proc.LedgerEngine{Pool: "g", Profile: "a", PID: pid, PGID: pid, StartTicks: st.Start, Token: "fake-token", Shim: sock})
	s, rest, _ := keptSet(t, dir, reloadConfig(t, `{"name": "g", "gpus": [0]}`, simProfile("a", []string{"g"})))
	if len(rest) != 1 || rest[0].PID != pid {
		t.Fatalf("left to the reap: %+v, want the engine of the older shim", rest)
	}
	want := fmt.Sprintf("its supervisor is of an older or newer poold (protocol 1; this poold speaks %d)", shim.Protocol)
	if ad := s.Pool("g").Status().Adoption; len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, want) {
		t.Fatalf("adoption %+v, want a refusal saying %q", ad, want)
	}
}
