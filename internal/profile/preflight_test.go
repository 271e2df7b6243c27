package profile

import (
	"errors"
	"io/fs"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// fakeHost has the binaries and files it lists; /root is unreadable.
func fakeHost(bins, files []string) Host {
	has := func(list []string, name string) bool {
		for _, n := range list {
			if n == name {
				return true
			}
		}
		return false
	}
	return Host{
		LookPath: func(file string) (string, error) {
			if has(bins, file) {
				return file, nil
			}
			return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
		},
		Stat: func(name string) (fs.FileInfo, error) {
			switch {
			case strings.HasPrefix(name, "/root/"):
				return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrPermission}
			case has(files, name):
				return fakeInfo{}, nil
			}
			return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
		},
	}
}

type fakeInfo struct{ fs.FileInfo }

// launch is the poold of the preflight tests, with the default launcher.
var launch = Launch{Self: "/usr/local/bin/poold"}

func TestWarnings(t *testing.T) {
	c := load(t, "good-host-warnings.json")
	got := c.Warnings(fakeHost([]string{"/usr/local/bin/poold"}, []string{"./models/llama"}), launch)
	want := []string{
		`profiles[0] "embed": args[0]: vLLM no longer accepts --task; use --runner pooling, or nothing: vLLM detects pooling models`,
		`profiles[0] "embed": engine binary "vllm" (the vllm-command setting) does not resolve on this host: exec: "vllm": executable file not found in $PATH`,
		`profiles[0] "embed": model "/srv/models/bge-m3": no such file or directory on this host`,
		`profiles[1] "chat": args[0]: vLLM no longer accepts --task; use --runner pooling, or nothing: vLLM detects pooling models`,
		`profiles[1] "chat": args[1]: vLLM no longer accepts --num-scheduler-steps; drop it: multi-step scheduling is gone`,
		`profiles[1] "chat": engine binary "vllm" (the vllm-command setting) does not resolve on this host: exec: "vllm": executable file not found in $PATH`,
		// A command's own flags are checked; its unused args are not.
		`profiles[2] "local": command[5]: vLLM no longer accepts --device; drop it: vLLM detects the platform, and CUDA_VISIBLE_DEVICES picks the GPUs`,
		`profiles[2] "local": command[0]: engine binary "/opt/vllm/bin/vllm" does not resolve on this host: exec: "/opt/vllm/bin/vllm": executable file not found in $PATH`,
		// {poold} is poold itself.
		`profiles[3] "sim": model "../models/sim": no such file or directory on this host`,
		`profiles[4] "locked": command[0]: engine binary "venv/bin/vllm" does not resolve on this host: exec: "venv/bin/vllm": executable file not found in $PATH`,
		`profiles[4] "locked": model "/root/models/x": stat /root/models/x: permission denied`,
		// A command that is not given {model} does not need it to exist.
	}
	if msg := errors.Join(got...); msg == nil || msg.Error() != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%v\nwant:\n%s", msg, strings.Join(want, "\n"))
	}

	// With the binary and the files there, only the flags remain.
	got = c.Warnings(fakeHost([]string{"vllm", "/opt/vllm/bin/vllm", "/usr/local/bin/poold", "venv/bin/vllm"},
		[]string{"/srv/models/bge-m3", "./models/llama", "../models/sim", "/root/models/x"}), launch)
	if len(got) != 5 {
		t.Errorf("%d warnings, want the 4 flags and the unreadable path:\n%v", len(got), errors.Join(got...))
	}
	// A host without lookups checks only the flags.
	if got := c.Warnings(Host{}, launch); len(got) != 4 {
		t.Errorf("no host: %d warnings, want 4:\n%v", len(got), errors.Join(got...))
	}
}

// The launcher's first word is the engine binary of the profiles without a
// command, named with the setting it comes from; their model is checked as
// the launcher is given it.
func TestWarningsOfALauncher(t *testing.T) {
	c := load(t, "good-host-warnings.json")
	python := Launch{Self: launch.Self, VLLM: []string{"/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"}}
	host := fakeHost([]string{"vllm", "/opt/vllm/bin/vllm", "/usr/local/bin/poold", "venv/bin/vllm"},
		[]string{"./models/llama", "../models/sim", "/root/models/x"})
	var got []string
	for _, err := range c.Warnings(host, python) {
		if !strings.Contains(err.Error(), "vLLM no longer accepts") && !strings.Contains(err.Error(), "/root/") {
			got = append(got, err.Error())
		}
	}
	want := []string{
		`profiles[0] "embed": engine binary "/opt/vllm/bin/python" (the vllm-command setting) does not resolve on this host: exec: "/opt/vllm/bin/python": executable file not found in $PATH`,
		`profiles[0] "embed": model "/srv/models/bge-m3": no such file or directory on this host`,
		`profiles[1] "chat": engine binary "/opt/vllm/bin/python" (the vllm-command setting) does not resolve on this host: exec: "/opt/vllm/bin/python": executable file not found in $PATH`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// With the launcher there, none remains: "vllm" is not looked for.
	host = fakeHost([]string{"/opt/vllm/bin/python", "/opt/vllm/bin/vllm", "/usr/local/bin/poold", "venv/bin/vllm"},
		[]string{"/srv/models/bge-m3", "./models/llama", "../models/sim", "/root/models/x"})
	if got := c.Warnings(host, python); len(got) != 5 {
		t.Errorf("%d warnings, want the 4 flags and the unreadable path:\n%v", len(got), errors.Join(got...))
	}
}

// TestRemovedFlagsAreFlags: every entry is a long flag as vLLM spells it,
// with what to do instead.
func TestRemovedFlagsAreFlags(t *testing.T) {
	for flag, hint := range removedFlags {
		if !strings.HasPrefix(flag, "--") || strings.ContainsAny(flag, "_= ") || strings.ToLower(flag) != flag ||
			!strings.HasPrefix(hint, "use --") && !strings.HasPrefix(hint, "drop it") {
			t.Errorf("%q: %q", flag, hint)
		}
	}
	for _, arg := range []string{"--runner", "-tp", "embed", "--task-name", "--tasks", "--"} {
		if _, hint := removedFlag(arg); hint != "" {
			t.Errorf("%q reported as removed", arg)
		}
	}
}

// An engine told to sleep by itself once idle is a warning, not a reason
// to refuse its start: it is in Warnings and not in Preflight.
func TestIdleSleepWarning(t *testing.T) {
	cfg, err := Parse([]byte(`{"pools": [{"name": "gpu0", "gpus": [0]}], "profiles": [
	  {"id": "sim", "command": ["{poold}", "engine-sim", "--port", "{port}", "--enable-sleep-mode", "--sim-idle-sleep=5m"]},
	  {"id": "shell", "command": ["sh", "-c", "exec poold engine-sim --port {port} --sim-idle-sleep 5m"]},
	  {"id": "args", "model": "org/m", "args": ["--enable-sleep-mode", "--sim-idle-sleep", "5m"]},
	  {"id": "plain", "model": "org/m", "args": ["--sim-idle-sleep-level", "2"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range cfg.Warnings(Host{}, launch) {
		got = append(got, w.Error())
	}
	wantPrefixes := []string{
		`profiles[0] "sim": command[5]: --sim-idle-sleep makes the engine sleep by itself once idle: poold notices it`,
		`profiles[1] "shell": command[2]: --sim-idle-sleep makes`,
		`profiles[2] "args": args[1]: --sim-idle-sleep makes`,
	}
	if len(got) != len(wantPrefixes) {
		t.Fatalf("warnings %q, want %d", got, len(wantPrefixes))
	}
	for i, w := range wantPrefixes {
		if !strings.HasPrefix(got[i], w) || !strings.Contains(got[i], "the first request after each such sleep waits for the wake") {
			t.Errorf("warning %q, want it to start %q and say what it costs", got[i], w)
		}
	}
	for _, p := range cfg.Profiles {
		if errs := p.Preflight(Host{}, launch); len(errs) > 0 {
			t.Errorf("%s: Preflight %v, want nothing (idle sleep does not fail a start)", p.ID, errs)
		}
	}
}
