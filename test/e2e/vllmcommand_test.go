package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A profile with a model and no command is started by the vllm-command
// setting, the model given as --model: here the launcher is poold's own
// simulator (as vLLM's CPU build's is its python -m
// vllm.entrypoints.openai.api_server). The engine serves, and its command
// line is the launcher's words, then --model and poold's flags; a cold start
// by request passes the check before it (the launcher resolves, where no
// vllm is on PATH); poold check looks for the launcher's first word.
func TestVLLMCommandStartsModelProfiles(t *testing.T) {
	tag := t.Name()
	env := map[string]string{"POOLD_E2E_TAG": runTag(tag), "GORACE": "atexit_sleep_ms=0"}
	profiles, err := json.Marshal(map[string]any{
		"pools":    []map[string]any{{"name": "p0", "gpus": []int{0}, "default": "m", "minResidency": "0s"}},
		"defaults": map[string]any{"stopTimeout": "5s", "startupTimeout": "30s", "env": env},
		"profiles": []map[string]any{{"id": "m", "model": "org/model-m"}, {"id": "n", "model": "org/model-n"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := startPoold(t, tag, profiles, "--vllm-command", pooldBin+" engine-sim")
	p := d.waitPool("p0", 20*time.Second, "m ready", func(p poolView) bool { return p.State == "ready" && p.Engine != nil })
	d.chat("m")

	raw, err := os.ReadFile("/proc/" + strconv.Itoa(p.Engine.PID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(string(bytes.TrimSuffix(raw, []byte{0})), "\x00")
	want := []string{pooldBin, "engine-sim", "--model", "org/model-m", "--host", "127.0.0.1", "--port", strconv.Itoa(p.Engine.Port),
		"--served-model-name", "m", "--tensor-parallel-size", "1"}
	if !slices.Equal(got, want) {
		t.Errorf("the engine's command line is\n%q\nwant\n%q", got, want)
	}
	d.chat("n")
	if p := d.pool("p0"); p.Profile != "n" || p.Engine == nil {
		t.Fatalf("pool %+v, want n loaded", p)
	}

	// poold check takes the setting as serve does (here from the
	// environment), and resolves its first word.
	dir := t.TempDir()
	conf := filepath.Join(dir, "poold.yaml")
	writeFile(t, conf, []byte("{}\n"))
	vars := []string{"POOLD_CONFIG=" + conf, "POOLD_VLLM_COMMAND=" + pooldBin + " engine-sim"}
	if code, stdout, stderr := runCLI(t, vars, pooldBin, "check", d.profiles); code != 0 || stdout != d.profiles+": ok\n" || stderr != "" {
		t.Errorf("poold check: exit %d, stdout %q, stderr %q; want ok and no warning", code, stdout, stderr)
	}
	python := filepath.Join(dir, "venv", "bin", "python")
	vars = []string{"POOLD_CONFIG=" + conf, "POOLD_VLLM_COMMAND=" + python + " -m vllm.entrypoints.openai.api_server"}
	var wantErr strings.Builder
	wantErr.WriteString(d.profiles + ": warnings:\n")
	for i, id := range []string{"m", "n"} {
		fmt.Fprintf(&wantErr, "profiles[%d] %q: engine binary %q (the vllm-command setting) does not resolve on this host: exec: %q: stat %s: no such file or directory\n",
			i, id, python, python, python)
	}
	if code, _, stderr := runCLI(t, vars, pooldBin, "check", d.profiles); code != 0 || stderr != wantErr.String() {
		t.Errorf("poold check of a missing launcher: exit %d, stderr:\n%s\nwant exit 0 and:\n%s", code, stderr, wantErr.String())
	}
}
