package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// configStatus is the "config" part of GET /status.
type configStatus struct {
	Path      string  `json:"path"`
	SHA256    string  `json:"sha256"`
	LastError *string `json:"lastError"`
}

func (d *daemon) config() configStatus {
	d.t.Helper()
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		d.t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		Config configStatus `json:"config"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		d.t.Fatalf("decoding /status: %v", err)
	}
	return st.Config
}

// waitConfig polls /status until the profiles in force have content's hash,
// failing after timeout.
func (d *daemon) waitConfig(content []byte, timeout time.Duration, what string) {
	d.t.Helper()
	sum := sha256.Sum256(content)
	want := hex.EncodeToString(sum[:])
	deadline := time.Now().Add(timeout)
	var last configStatus
	for time.Now().Before(deadline) {
		if last = d.config(); last.SHA256 == want && last.LastError == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	d.t.Fatalf("%s: the new profiles were not in force within %s; config: %+v", what, timeout, last)
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReloadReplacementStyles replaces the profiles file in each way a GitOps
// agent does and checks that poold has the new file in force within 2 s.
func TestReloadReplacementStyles(t *testing.T) {
	pools := []pool{{Name: "p0", GPUs: []int{0}}}
	styles := []struct {
		name string
		// setup lays out dir and returns the path poold is given.
		setup   func(t *testing.T, dir string, first []byte) string
		replace func(t *testing.T, dir, path string, next []byte)
	}{
		{"in-place write", plainProfiles, func(t *testing.T, dir, path string, next []byte) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(next); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}},
		{"write temp and rename", plainProfiles, func(t *testing.T, dir, path string, next []byte) {
			tmp := filepath.Join(dir, ".profiles.json.tmp")
			writeFile(t, tmp, next)
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"delete and create", plainProfiles, func(t *testing.T, dir, path string, next []byte) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, next)
		}},
		{"..data symlink flip", func(t *testing.T, dir string, first []byte) string {
			flipData(t, dir, "..v1", first)
			path := filepath.Join(dir, "profiles.json")
			if err := os.Symlink("..data/profiles.json", path); err != nil {
				t.Fatal(err)
			}
			return path
		}, func(t *testing.T, dir, path string, next []byte) {
			flipData(t, dir, "..v2", next)
			if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, style := range styles {
		t.Run(style.name, func(t *testing.T) {
			tag := t.Name()
			first := profilesJSON(tag, pools, []sim{{ID: "a"}}, nil)
			next := profilesJSON(tag, pools, []sim{{ID: "a"}, {ID: "b"}}, nil)
			dir := t.TempDir()
			path := style.setup(t, dir, first)
			d := startPoold(t, tag, first, "--profiles", path)
			d.waitConfig(first, 10*time.Second, "start")

			style.replace(t, dir, path, next)
			d.waitConfig(next, 2*time.Second, style.name)
			// The new profile is servable at once.
			code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("b", false, 2))
			if err != nil || code != http.StatusOK {
				t.Fatalf("request for the new profile: %d %v %s", code, err, body)
			}
		})
	}
}

func plainProfiles(t *testing.T, dir string, first []byte) string {
	path := filepath.Join(dir, "profiles.json")
	writeFile(t, path, first)
	return path
}

// flipData writes content into dir/version/profiles.json and points dir/..data
// at it atomically, as a Kubernetes ConfigMap volume (and git-sync) do.
func flipData(t *testing.T, dir, version string, content []byte) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, version, "profiles.json"), content)
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// streamResult is one finished chat request.
type streamResult struct {
	code int
	body []byte
	err  error
}

// startStream posts a streaming chat for model in the background.
func (d *daemon) startStream(model string, tokens int) <-chan streamResult {
	done := make(chan streamResult, 1)
	go func() {
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody(model, true, tokens))
		done <- streamResult{code, body, err}
	}()
	return done
}

// TestReloadTouchesOnlyChangedPools changes only pool B's profile while a
// stream runs on pool A: A's engine and stream are untouched, B restarts.
func TestReloadTouchesOnlyChangedPools(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "A", GPUs: []int{0}, Default: "a"}, {Name: "B", GPUs: []int{1}, Default: "b"}}
	simA := sim{ID: "a", Pools: []string{"A"}, Flags: []string{"--sim-itl", "40ms"}}
	first := profilesJSON(tag, pools, []sim{simA, {ID: "b", Pools: []string{"B"}}}, nil)
	d := startPoold(t, tag, first)
	a := d.waitPool("A", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	b := d.waitPool("B", 20*time.Second, "b ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "b" })

	// 6 s of stream: B's restart, well under a second here, must end within it.
	stream := d.startStream("a", 150)
	d.waitPool("A", 10*time.Second, "a in flight", func(p poolView) bool { return p.InFlight == 1 })
	next := profilesJSON(tag, pools, []sim{simA, {ID: "b", Pools: []string{"B"}, Flags: []string{"--sim-tokens", "7"}}}, nil)
	writeFile(t, d.profiles, next)
	d.waitConfig(next, 10*time.Second, "reload")
	d.waitPool("B", 20*time.Second, "b restarted", func(p poolView) bool {
		return p.State == "ready" && p.Profile == "b" && p.Engine != nil && p.Engine.PID != b.Engine.PID
	})
	if p := d.pool("A"); p.State != "ready" || p.Engine == nil || p.Engine.PID != a.Engine.PID || p.InFlight != 1 {
		t.Fatalf("pool A after a reload of pool B: %+v, want ready on pid %d with its stream in flight", p, a.Engine.PID)
	}
	r := <-stream
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("stream on A: %d %v", r.code, r.err)
	}
	checkStream(t, r.body, "a", 150)
	if p := d.pool("A"); p.Engine == nil || p.Engine.PID != a.Engine.PID {
		t.Fatalf("pool A's engine changed: %+v", p.Engine)
	}
}

// TestReloadChangedArgsRestartsAfterStream changes the loaded profile's engine
// flags while a stream runs: the pool drains, the stream completes intact on
// the old engine, and only then does a new engine start.
func TestReloadChangedArgsRestartsAfterStream(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}
	first := profilesJSON(tag, pools, []sim{{ID: "a", Flags: []string{"--sim-itl", "40ms"}}}, nil)
	d := startPoold(t, tag, first)
	old := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	stream := d.startStream("a", 40)
	d.waitPool("p0", 10*time.Second, "a in flight", func(p poolView) bool { return p.InFlight == 1 })
	next := profilesJSON(tag, pools, []sim{{ID: "a", Flags: []string{"--sim-itl", "40ms", "--sim-tokens", "7"}}}, nil)
	writeFile(t, d.profiles, next)
	d.waitConfig(next, 10*time.Second, "reload")
	// Draining on the old engine, which is still alive, while the stream runs.
	d.waitPool("p0", 10*time.Second, "draining", func(p poolView) bool {
		return p.State == "draining" && p.Profile == "a" && p.InFlight == 1 && p.Engine != nil && p.Engine.PID == old.Engine.PID
	})
	if len(groupAlive(old.Engine.PID)) == 0 {
		t.Fatal("the old engine died while its stream was in flight")
	}
	r := <-stream
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("stream: %d %v", r.code, r.err)
	}
	checkStream(t, r.body, "a", 40)
	p := d.waitPool("p0", 20*time.Second, "restarted", func(p poolView) bool {
		return p.State == "ready" && p.Profile == "a" && p.Engine != nil && p.Engine.PID != old.Engine.PID
	})
	if left := groupAlive(old.Engine.PID); len(left) > 0 {
		t.Fatalf("the old engine's group survived the restart: %v", left)
	}
	// The new engine runs the new flags: without max_tokens it answers 7 tokens.
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"hi"}]}`)
	var resp struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &resp) != nil || resp.Usage.CompletionTokens != 7 {
		t.Fatalf("request to the restarted engine (pid %d): %d %v %s", p.Engine.PID, code, err, body)
	}
}

// TestReloadBadFileChangesNothing writes an invalid file: everything keeps
// running, the refusal shows in /status and the metrics, and a good file
// recovers.
func TestReloadBadFileChangesNothing(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}
	first := profilesJSON(tag, pools, []sim{{ID: "a"}}, nil)
	d := startPoold(t, tag, first)
	old := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	const ok = "poold_config_last_reload_successful"
	if v := d.metricValue(ok); v != 1 {
		t.Fatalf("%s = %v at start, want 1", ok, v)
	}
	firstSHA := d.config().SHA256

	writeFile(t, d.profiles, []byte(`{"pools": [{"name": "p0", "gpus": [0], "default": "nope"}], "profiles": []}`))
	deadline := time.Now().Add(10 * time.Second)
	for d.config().LastError == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	c := d.config()
	if c.LastError == nil || *c.LastError != `pools[0] "p0": default "nope": no such profile` {
		t.Fatalf("config.lastError = %v, want the validation error", c.LastError)
	}
	if c.SHA256 != firstSHA {
		t.Fatalf("config.sha256 changed to %s after a refused reload", c.SHA256)
	}
	if v := d.metricValue(ok); v != 0 {
		t.Fatalf("%s = %v after a refused reload, want 0", ok, v)
	}
	if p := d.pool("p0"); p.State != "ready" || p.Engine == nil || p.Engine.PID != old.Engine.PID {
		t.Fatalf("pool after a refused reload: %+v", p)
	}
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("a", false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("request after a refused reload: %d %v %s", code, err, body)
	}

	next := profilesJSON(tag, pools, []sim{{ID: "a"}, {ID: "c"}}, nil)
	writeFile(t, d.profiles, next)
	d.waitConfig(next, 10*time.Second, "recovery")
	if v := d.metricValue(ok); v != 1 {
		t.Fatalf("%s = %v after recovering, want 1", ok, v)
	}
	if p := d.pool("p0"); p.Engine == nil || p.Engine.PID != old.Engine.PID {
		t.Fatalf("recovering restarted an unchanged engine: %+v", p.Engine)
	}
}

// TestReloadOnSIGHUP turns the watcher off: only SIGHUP makes poold reload.
func TestReloadOnSIGHUP(t *testing.T) {
	tag := t.Name()
	pools := []pool{{Name: "p0", GPUs: []int{0}}}
	first := profilesJSON(tag, pools, []sim{{ID: "a"}}, nil)
	d := startPoold(t, tag, first, "--watch=false")
	next := profilesJSON(tag, pools, []sim{{ID: "a"}, {ID: "b"}}, nil)
	writeFile(t, d.profiles, next)
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	d.waitConfig(next, 10*time.Second, "SIGHUP")
	if d.config().Path != d.profiles {
		t.Fatalf("config.path = %q, want %q", d.config().Path, d.profiles)
	}
}

// TestRestartAfterCrashStopsLeftovers SIGKILLs poold while its engine (with a
// VLLM::EngineCore child that outlives its parent) runs, then starts poold
// again on the same state directory: the leftover child is stopped before the
// pool is served by a fresh engine.
func TestRestartAfterCrashStopsLeftovers(t *testing.T) {
	tag := t.Name()
	state := t.TempDir()
	profiles := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}},
		[]sim{{ID: "a", Flags: []string{"--sim-spawn-child"}}}, nil)
	first := startPoold(t, tag, profiles, "--state-dir", state)
	old := first.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	var members []int
	deadline := time.Now().Add(10 * time.Second)
	for len(members) < 2 && time.Now().Before(deadline) {
		members = groupAlive(old.Engine.PID)
		time.Sleep(5 * time.Millisecond)
	}
	child := slices.DeleteFunc(slices.Clone(members), func(pid int) bool { return pid == old.Engine.PID })
	if len(child) != 1 {
		t.Fatalf("engine group %v: want the engine and its child", members)
	}
	// Once the child has logged its start, it writes nothing more: it will not
	// die of SIGPIPE on the pipe to the dead poold.
	for !strings.Contains(first.stderr.String(), "engine core child started") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}

	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.exited
	// Pdeathsig takes the engine; its child is left behind, as vLLM's are.
	for alive(old.Engine.PID) && time.Now().Before(deadline.Add(10*time.Second)) {
		time.Sleep(5 * time.Millisecond)
	}
	if alive(old.Engine.PID) || !alive(child[0]) {
		t.Fatalf("after SIGKILL: engine alive %t, child alive %t; want only the child", alive(old.Engine.PID), alive(child[0]))
	}

	second := startPoold(t, tag, profiles, "--state-dir", state)
	fresh := second.waitPool("p0", 30*time.Second, "a ready again", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	if alive(child[0]) {
		t.Fatalf("the leftover child %d still runs after the restart", child[0])
	}
	if fresh.Engine.PID == old.Engine.PID {
		t.Fatalf("the pool is served by pid %d, the old engine's", fresh.Engine.PID)
	}
	code, _, body, err := second.post(context.Background(), "/v1/chat/completions", chatBody("a", false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("request after the restart: %d %v %s", code, err, body)
	}
}

// TestPdeathsigAloneLeavesNoEngine SIGKILLs poold outside systemd (no cgroup
// to clean up after it): Pdeathsig alone must take its engine down.
func TestPdeathsigAloneLeavesNoEngine(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil))
	p := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	deadline := time.Now().Add(10 * time.Second)
	for len(taggedProcesses(tag)) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if left := taggedProcesses(tag); len(left) > 0 {
		t.Fatalf("engine processes %v (engine pid %d) outlived the SIGKILLed poold", left, p.Engine.PID)
	}
}
