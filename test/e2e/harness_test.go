// Package e2e runs the built poold binary as a real process, with the bundled
// vLLM simulator as its engines, through real HTTP and real signals.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pooldBin and fleetdBin are the binaries built once for the whole package.
var pooldBin, fleetdBin string

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEngineEnv); mode != "" {
		os.Exit(runHelperEngine(mode, os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "poold-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pooldBin, fleetdBin = filepath.Join(dir, "poold"), filepath.Join(dir, "fleetd")
	args := []string{"build", "-o", dir}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "github.com/poold/poold/cmd/poold", "github.com/poold/poold/cmd/fleetd")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building poold and fleetd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sim is one simulator profile for a test's profiles file.
type sim struct {
	ID      string
	Aliases []string
	Pools   []string
	Flags   []string // extra engine-sim flags
	Extra   map[string]any
}

// pool is one pool of a test's profiles file.
type pool struct {
	Name    string
	GPUs    []int
	Default string
	Extra   map[string]any
}

// profilesJSON renders a profiles file whose engines are the simulator, each
// tagged with tag in its environment so that the test can find every process
// it left behind.
func profilesJSON(tag string, pools []pool, sims []sim, defaults map[string]any) []byte {
	var ps []map[string]any
	for _, p := range pools {
		m := map[string]any{"name": p.Name, "gpus": p.GPUs}
		if p.Default != "" {
			m["default"] = p.Default
		}
		for k, v := range p.Extra {
			m[k] = v
		}
		ps = append(ps, m)
	}
	var profs []map[string]any
	for _, s := range sims {
		cmd := append([]string{"{poold}", "engine-sim", "/models/" + s.ID, "--port", "{port}", "--served-model-name", "{id}"}, s.Flags...)
		// A simulator built with the race detector would sleep a second
		// at exit (GORACE's atexit_sleep_ms): every stop would take as long.
		m := map[string]any{"id": s.ID, "command": cmd, "env": map[string]string{"POOLD_E2E_TAG": runTag(tag), "GORACE": "atexit_sleep_ms=0"}}
		if len(s.Aliases) > 0 {
			m["aliases"] = s.Aliases
		}
		if len(s.Pools) > 0 {
			m["pools"] = s.Pools
		}
		for k, v := range s.Extra {
			m[k] = v
		}
		profs = append(profs, m)
	}
	if defaults == nil {
		defaults = map[string]any{}
	}
	if _, ok := defaults["stopTimeout"]; !ok {
		defaults["stopTimeout"] = "5s"
	}
	if _, ok := defaults["startupTimeout"]; !ok {
		defaults["startupTimeout"] = "30s"
	}
	b, _ := json.MarshalIndent(map[string]any{"pools": ps, "profiles": profs, "defaults": defaults}, "", "  ")
	return b
}

// daemon is one running poold.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	tag    string
	stdout *lockedBuffer // the access log
	stderr *lockedBuffer
	exited chan struct{}
	err    error // valid after exited is closed
	// profiles is the profiles file; its directory also holds the state
	// directory, "state", unless the test's args give another --state-dir.
	profiles string
}

// lockedBuffer is a bytes.Buffer safe for one writer and concurrent readers.
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

// startPoold writes profiles and runs poold on a free loopback port, waiting
// until /health answers. The daemon is stopped (SIGTERM, then SIGKILL) and its
// leftover processes are checked for at cleanup.
func startPoold(t *testing.T, tag string, profiles []byte, args ...string) *daemon {
	t.Helper()
	d := launch(t, tag, profiles, args...)
	d.waitHealthy()
	return d
}

// launch starts poold without waiting for it to serve.
func launch(t *testing.T, tag string, profiles []byte, args ...string) *daemon {
	t.Helper()
	return launchWith(t, tag, profiles, nil, args...)
}

// launchWith starts poold without waiting for it to serve, after setup (if
// not nil) has adjusted its command: its environment, its process
// attributes.
func launchWith(t *testing.T, tag string, profiles []byte, setup func(*exec.Cmd), args ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "profiles.json")
	if err := os.WriteFile(path, profiles, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	d := &daemon{t: t, url: "http://" + addr, tag: tag, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{}), profiles: path}
	// Engines stop with poold unless a test keeps them
	// (--keep-engines-on-restart, restart_test.go): the leftover check
	// below counts on it.
	all := append([]string{"serve", "--listen", addr, "--profiles", path, "--log-format", "json", "--log-level", "debug",
		"--state-dir", filepath.Join(dir, "state"), "--keep-engines-on-restart=false"}, args...)
	d.cmd = exec.Command(pooldBin, all...)
	d.cmd.Stdout, d.cmd.Stderr = d.stdout, d.stderr
	if setup != nil {
		setup(d.cmd)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.stop()
		// The pools refuse, and log, a state change their state machine does
		// not allow: in a test, a bug.
		if strings.Contains(d.stderr.String(), "invalid pool state transition") {
			t.Errorf("poold logged an invalid pool state transition")
		}
		if t.Failed() {
			t.Logf("poold stderr:\n%s", tail(d.stderr.String(), 60))
		}
		d.killLeftovers()
	})
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// stop sends SIGTERM and waits for poold to exit, SIGKILLing it after 30 s.
func (d *daemon) stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Errorf("poold did not exit within 30s of SIGTERM")
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// killLeftovers fails the test if any process tagged for this daemon survived,
// and kills it.
func (d *daemon) killLeftovers() {
	if pids := taggedProcesses(d.tag); len(pids) > 0 {
		d.t.Errorf("processes left behind: %v", pids)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// runTag is tag made unique to this test process, so that two runs of the
// suite on one machine (two checkouts, say) never count or kill each other's
// engines.
func runTag(tag string) string { return tag + "@" + strconv.Itoa(os.Getpid()) }

// taggedProcesses lists live processes whose environment holds
// POOLD_E2E_TAG=runTag(tag).
func taggedProcesses(tag string) []int {
	want := []byte("POOLD_E2E_TAG=" + runTag(tag) + "\x00")
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// groupAlive lists the live members of process group pgid.
func groupAlive(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[0] != "X" && f[2] == strconv.Itoa(pgid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (d *daemon) waitHealthy() {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.exited:
			d.t.Fatalf("poold exited early: %v\n%s", d.err, d.stderr.String())
		default:
		}
		resp, err := http.Get(d.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.t.Fatalf("poold not healthy after 30s\n%s", d.stderr.String())
}

// status is the part of GET /status the tests read.
type status struct {
	Version     string `json:"version"`
	Containment struct {
		Mode   string `json:"mode"`
		Reason string `json:"reason"`
	} `json:"containment"`
	Pools []struct {
		Name         string         `json:"name"`
		State        string         `json:"state"`
		Profile      *string        `json:"profile"`
		SwitchingTo  *string        `json:"switchingTo"`
		InFlight     int            `json:"inFlight"`
		Waiting      map[string]int `json:"waiting"`
		OldestWaitMs int64          `json:"oldestWaitMs"`
		Gate         string         `json:"gate"`
		LastError    *string        `json:"lastError"`
		Engine       *struct {
			Profile string `json:"profile"`
			PID     int    `json:"pid"`
			Port    int    `json:"port"`
		} `json:"engine"`
		EngineStats *engineStats `json:"engineStats"`
	} `json:"pools"`
}

func (d *daemon) status() status {
	d.t.Helper()
	st, err := d.fetchStatus()
	if err != nil {
		d.t.Fatal(err)
	}
	return st
}

// fetchStatus is status for a goroutine other than the test's, which must
// not call Fatal.
func (d *daemon) fetchStatus() (status, error) {
	var st status
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		return st, fmt.Errorf("GET /status: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("decoding /status: %w", err)
	}
	return st, nil
}

// poolStatus is the status of one pool.
func (d *daemon) pool(name string) poolView {
	d.t.Helper()
	for _, p := range d.status().Pools {
		if p.Name == name {
			return poolView{p.State, deref(p.Profile), deref(p.SwitchingTo), p.InFlight, p.Waiting, p.Gate, deref(p.LastError), p.Engine}
		}
	}
	d.t.Fatalf("no pool %q in /status", name)
	return poolView{}
}

type poolView struct {
	State, Profile, SwitchingTo string
	InFlight                    int
	Waiting                     map[string]int
	Gate                        string
	LastError                   string
	Engine                      *struct {
		Profile string `json:"profile"`
		PID     int    `json:"pid"`
		Port    int    `json:"port"`
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// waitPool polls the pool's status until cond holds, failing after timeout.
func (d *daemon) waitPool(name string, timeout time.Duration, what string, cond func(poolView) bool) poolView {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	var last poolView
	for time.Now().Before(deadline) {
		last = d.pool(name)
		if cond(last) {
			return last
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.t.Fatalf("pool %s: %s not reached within %s; last: %+v", name, what, timeout, last)
	return last
}

// post sends a JSON body and returns the status and body.
func (d *daemon) post(ctx context.Context, path, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, rest)
		}
	}
	return out
}

// metricValue reads one sample from GET /metrics: name{labels} exactly as
// exposed (labels in the registry's sorted order), or -1 if absent.
func (d *daemon) metricValue(series string) float64 {
	d.t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				d.t.Fatalf("metric %s: %v", series, err)
			}
			return v
		}
	}
	return -1
}
