package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Restarts with keep-engines-on-restart: the engines run under their
// shims (`poold engine-shim`) across a restart of poold and the next poold
// adopts them. systemd is not run here: each test runs the steps that the
// shipped unit's `systemctl restart` takes (KillMode=process: SIGTERM to
// poold alone, whose engines' shims run in sessions of their own, then a
// new poold on the same state directory), which is the process layout the
// unit gives.

// loadDelay is every simulator's load in these tests: a first request
// answered in less did not wait for a load.
const loadDelay = 3 * time.Second

// loadingSim is a simulator profile that takes loadDelay to load.
func loadingSim(id string, pools ...string) sim {
	return sim{ID: id, Pools: pools, Flags: []string{"--sim-load-delay", loadDelay.String(), "--sim-ttft", "20ms"}}
}

// keepArgs are the flags of a poold that keeps its engines across a
// restart, with its state in dir.
func keepArgs(dir string, adopt time.Duration) []string {
	return []string{"--keep-engines-on-restart", "--adopt-timeout", adopt.String(), "--state-dir", dir}
}

// adoption is one entry of a pool's /status "adoption" list.
type adoption struct {
	Profile  string `json:"profile"`
	PID      int    `json:"pid"`
	Sleeping int    `json:"sleeping"`
	Adopted  bool   `json:"adopted"`
	Reason   string `json:"reason"`
}

func (d *daemon) adoption(pool string) []adoption {
	d.t.Helper()
	var p struct {
		Adoption []adoption `json:"adoption"`
	}
	d.poolJSON(pool, &p)
	return p.Adoption
}

// engineStarts counts the engines that started under this poold, by their
// own first output line, as poold logs it.
func (d *daemon) engineStarts() int { return len(d.engineLines("msg=\"loading model\"")) }

// timedChat sends one request, fails the test unless it is answered, and
// returns how long it took.
func (d *daemon) timedChat(model string) time.Duration {
	d.t.Helper()
	t := time.Now()
	d.chat(model)
	took := time.Since(t)
	d.t.Logf("first request for %s after the restart answered in %s", model, took)
	return took
}

// serving waits for pool to serve profile and returns its engine's pid.
func (d *daemon) serving(pool, profile string) int {
	d.t.Helper()
	v := d.waitPool(pool, 30*time.Second, profile+" ready", func(p poolView) bool {
		return p.State == "ready" && p.Profile == profile && p.Engine != nil
	})
	return v.Engine.PID
}

// stopEngines runs `poold stop-engines` on the state directory dir, and
// waits until no process tagged tag is left.
func stopEngines(t *testing.T, dir, tag string) {
	t.Helper()
	out, err := exec.Command(pooldBin, "stop-engines", "--state-dir", dir, "--grace", "5s").CombinedOutput()
	if err != nil {
		t.Fatalf("poold stop-engines: %v\n%s", err, out)
	}
	t.Logf("poold stop-engines: %s", strings.TrimSpace(string(out)))
	waitNoProcess(t, tag, 30*time.Second)
}

// waitNoProcess polls until no live process is tagged tag.
func waitNoProcess(t *testing.T, tag string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pids := taggedProcesses(tag)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes still live after %s: %v", timeout, pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestartKeepsEngines: two pools loaded, one of them with a sleeper; a
// restart of poold starts no engine, shows the same engines, and answers
// the first requests without a load; the sleeper is adopted asleep and
// wakes. Then `poold stop-engines` leaves no process.
func TestRestartKeepsEngines(t *testing.T) {
	tag := t.Name()
	state := t.TempDir()
	a, c := sleepSim("a"), sleepSim("c")
	a.Pools, c.Pools = []string{"p0"}, []string{"p0"}
	profiles := profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s", "maxSleeping": 1}}, {Name: "p1", GPUs: []int{1}, Default: "b"}},
		[]sim{a, c, loadingSim("b", "p1")}, nil)
	args := keepArgs(state, time.Minute)
	t.Log("without systemd: the steps of the unit's `systemctl restart` (KillMode=process) run by hand: SIGTERM to poold alone, then a new poold on the same state directory")

	d1 := startPoold(t, tag, profiles, args...)
	d1.serving("p0", "a")
	b := d1.serving("p1", "b")
	d1.chat("c") // a goes to sleep
	cPID := d1.serving("p0", "c")
	sl := d1.sleeping("p0")
	if len(sl) != 1 || sl[0].Profile != "a" {
		t.Fatalf("sleeping before the restart: %+v, want a", sl)
	}
	aPID := sl[0].PID
	d1.stop()
	if d1.err != nil {
		t.Fatalf("poold exited with %v", d1.err)
	}
	for _, pid := range []int{aPID, b, cPID} {
		if !alive(pid) {
			t.Fatalf("engine %d did not outlive poold's shutdown", pid)
		}
	}

	d2 := startPoold(t, tag, profiles, args...)
	if l := d2.logLinesAtLeast("poold listening", 1); len(l) != 1 || l[0]["keep_engines_on_restart"] != true {
		t.Errorf("start-up line %v: want keep_engines_on_restart true", l)
	}
	if n := len(d2.logLines("adopted an engine left running by the previous poold")); n != 3 {
		t.Errorf("%d engines adopted in the log, want 3", n)
	}
	if got := d2.serving("p0", "c"); got != cPID {
		t.Errorf("p0 serves c from pid %d after the restart, want %d", got, cPID)
	}
	if got := d2.serving("p1", "b"); got != b {
		t.Errorf("p1 serves b from pid %d after the restart, want %d", got, b)
	}
	for _, m := range []string{"c", "b"} {
		if took := d2.timedChat(m); took >= loadDelay {
			t.Errorf("the first request for %s took %s, as long as a load", m, took)
		}
	}
	if sl := d2.sleeping("p0"); len(sl) != 1 || sl[0].Profile != "a" || sl[0].PID != aPID || sl[0].Level != 1 {
		t.Fatalf("sleeping after the restart: %+v, want a (pid %d, level 1)", sl, aPID)
	}
	if ad := d2.adoption("p0"); len(ad) != 2 || !ad[0].Adopted || !ad[1].Adopted {
		t.Errorf("p0's adoption: %+v, want both engines adopted", ad)
	}
	if out, err := exec.Command(pooldBin, "stop-engines", "--state-dir", state).CombinedOutput(); err == nil || !strings.Contains(string(out), "in use by another poold") {
		t.Errorf("poold stop-engines while poold runs: %v, %s; want it refused", err, out)
	}
	d2.chat("a") // wakes the adopted sleeper
	if got := d2.serving("p0", "a"); got != aPID {
		t.Errorf("p0 serves a from pid %d after the wake, want the sleeper's %d", got, aPID)
	}
	if n := d2.engineStarts(); n != 0 {
		t.Errorf("%d engines started after the restart, want 0", n)
	}

	d2.stop()
	stopEngines(t, state, tag)
}

// TestRestartChangedProfile: a profile changed while poold was down is not
// adopted, and the refusal names what changed; its pool alone loads afresh.
// A poold started from another shell (another SHELL, XDG session, locale)
// adopts an unchanged profile's engine all the same.
func TestRestartChangedProfile(t *testing.T) {
	tag := t.Name()
	state := t.TempDir()
	pools := []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "b"}, {Name: "p2", GPUs: []int{2}, Default: "c"}}
	b := loadingSim("b", "p1")
	c := loadingSim("c", "p2")
	cEnv := func(v string) map[string]any {
		return map[string]any{"env": map[string]string{"POOLD_E2E_TAG": runTag(tag), "GORACE": "atexit_sleep_ms=0", "C_SETTING": v}}
	}
	c.Extra = cEnv("1")
	shell := func(name, session string) func(*exec.Cmd) {
		return func(cmd *exec.Cmd) {
			cmd.Env = append(os.Environ(), "SHELL=/bin/"+name, "XDG_SESSION_ID="+session, "LC_TIME=C."+name)
		}
	}
	args := keepArgs(state, time.Minute)
	d1 := launchWith(t, tag, profilesJSON(tag, pools, []sim{loadingSim("a", "p0"), b, c}, nil), shell("sh", "1"), args...)
	d1.waitHealthy()
	aPID, bPID, cPID := d1.serving("p0", "a"), d1.serving("p1", "b"), d1.serving("p2", "c")
	d1.stop()

	b.Flags = append(slices.Clone(b.Flags), "--sim-itl", "5ms")
	c.Extra = cEnv("2")
	d2 := launchWith(t, tag, profilesJSON(tag, pools, []sim{loadingSim("a", "p0"), b, c}, nil), shell("zsh", "2"), args...)
	d2.waitHealthy()
	if got := d2.serving("p0", "a"); got != aPID {
		t.Errorf("p0 serves a from pid %d, want the adopted %d (adoption %+v)", got, aPID, d2.adoption("p0"))
	}
	if got := d2.serving("p1", "b"); got == bPID {
		t.Errorf("p1 serves the changed b from the old engine %d", got)
	}
	if got := d2.serving("p2", "c"); got == cPID {
		t.Errorf("p2 serves the changed c from the old engine %d", got)
	}
	if n := d2.engineStarts(); n != 2 {
		t.Errorf("%d engines started after the restart, want 2 (the changed b and c)", n)
	}
	for _, w := range []struct{ pool, reason string }{
		{"p1", "argument --sim-itl added"},
		{"p2", "variable C_SETTING changed"},
	} {
		if ad := d2.adoption(w.pool); len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, "profile changed") || !strings.Contains(ad[0].Reason, w.reason) {
			t.Errorf("%s's adoption: %+v, want a refusal for its changed profile that says %q", w.pool, ad, w.reason)
		} else if strings.Contains(ad[0].Reason, "C_SETTING=") || strings.Contains(ad[0].Reason, "5ms") {
			t.Errorf("%s's refusal shows a value: %q", w.pool, ad[0].Reason)
		}
	}
	for _, pid := range []int{bPID, cPID} {
		if alive(pid) {
			t.Errorf("the old engine %d of a changed profile still runs", pid)
		}
	}
	d2.stop()
	stopEngines(t, state, tag)
}

// TestRestartEngineGone: one engine died while poold was down, another
// process took the port of the other; each is found, cleaned up and loaded
// afresh, and /status says why.
func TestRestartEngineGone(t *testing.T) {
	tag := t.Name()
	state := t.TempDir()
	b := loadingSim("b", "p1")
	b.Flags = append(b.Flags, "--sim-reuseport") // lets another process bind its port
	profiles := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "b"}},
		[]sim{loadingSim("a", "p0"), b}, nil)
	args := keepArgs(state, time.Minute)
	d1 := startPoold(t, tag, profiles, args...)
	aPID := d1.serving("p0", "a")
	bPID := d1.serving("p1", "b")
	bPort := d1.pool("p1").Engine.Port
	d1.stop()

	if err := syscall.Kill(-aPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); cerr != nil {
			return cerr
		}
		return err
	}}
	squatter, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(bPort))
	if err != nil {
		t.Fatalf("taking the port of b: %v", err)
	}
	defer squatter.Close()

	d2 := startPoold(t, tag, profiles, args...)
	if got := d2.serving("p0", "a"); got == aPID {
		t.Errorf("p0 serves a from the dead engine's pid %d", got)
	}
	if got := d2.serving("p1", "b"); got == bPID {
		t.Errorf("p1 serves b from the engine whose port was taken (%d)", got)
	}
	if ad := d2.adoption("p0"); len(ad) != 1 || ad[0].Adopted || ad[0].Reason == "" {
		t.Errorf("p0's adoption: %+v, want a refused with a reason", ad)
	} else {
		t.Logf("p0: %s", ad[0].Reason)
	}
	if ad := d2.adoption("p1"); len(ad) != 1 || ad[0].Adopted || !strings.Contains(ad[0].Reason, "another process listens") {
		t.Errorf("p1's adoption: %+v, want b refused for the other listener on its port", ad)
	}
	if n := len(d2.logLines("is not adopted")); n != 2 {
		t.Errorf("%d log lines say an engine was not adopted, want 2", n)
	}
	if n := d2.engineStarts(); n != 2 {
		t.Errorf("%d engines started after the restart, want 2", n)
	}
	if alive(bPID) {
		t.Errorf("the engine of b whose port was taken (pid %d) still runs", bPID)
	}
	d2.stop()
	stopEngines(t, state, tag)
}

// TestCrashWithoutRestart: poold is SIGKILLed and none follows it; once the
// adopt timeout has passed, the shims have stopped their engines, and no
// process is left.
func TestCrashWithoutRestart(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "b"}},
		[]sim{loadingSim("a", "p0"), loadingSim("b", "p1")}, nil), keepArgs(t.TempDir(), 2*time.Second)...)
	pids := []int{d.serving("p0", "a"), d.serving("p1", "b")}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	waitNoProcess(t, tag, 60*time.Second)
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("engine %d outlived its poold's crash", pid)
		}
	}
}

// TestRestartWithoutKeep: with keep-engines-on-restart off, a shutdown
// stops the engines and the next poold loads afresh; a poold started with
// it off after one that kept its engines stops those and loads afresh too.
func TestRestartWithoutKeep(t *testing.T) {
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	profiles := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{loadingSim("a", "p0")}, nil)
	d1 := startPoold(t, tag, profiles, "--state-dir", state)
	pid := d1.serving("p0", "a")
	d1.stop()
	if alive(pid) {
		t.Fatalf("engine %d outlived poold's shutdown with keep-engines-on-restart off", pid)
	}
	waitNoProcess(t, tag, 30*time.Second)
	d2 := startPoold(t, tag, profiles, keepArgs(state, time.Minute)...)
	kept := d2.serving("p0", "a")
	if kept == pid {
		t.Errorf("p0 serves a from the old pid %d", kept)
	}
	if n := d2.engineStarts(); n != 1 {
		t.Errorf("%d engines started after the restart, want 1", n)
	}
	d2.stop()
	if !alive(kept) {
		t.Fatalf("engine %d did not outlive poold's shutdown with keep-engines-on-restart on", kept)
	}
	d3 := startPoold(t, tag, profiles, "--state-dir", state)
	if got := d3.serving("p0", "a"); got == kept {
		t.Errorf("p0 serves a from the kept engine %d with keep-engines-on-restart off", got)
	}
	if alive(kept) {
		t.Errorf("the kept engine %d still runs under a poold with keep-engines-on-restart off", kept)
	}
}
