package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poold/poold/internal/profile"
)

// TestCheckBadFiles runs `poold check` on every golden bad profiles file: exit
// 1, nothing on stdout, and on stderr a header line followed by exactly the
// lines of the paired .errors file.
func TestCheckBadFiles(t *testing.T) {
	files, err := filepath.Glob("../../internal/profile/testdata/bad-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 12 {
		t.Fatalf("found %d bad files, want at least 12", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(file, ".json") + ".errors")
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			if code := check([]string{file}, profile.Host{}, "", &stdout, &stderr); code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q, want nothing", stdout.String())
			}
			if got := stderr.String(); got != file+": invalid:\n"+string(want) {
				t.Errorf("stderr:\n%s\nwant %q then:\n%s", got, file+": invalid:", want)
			}
		})
	}
}

func TestCheckGoodAndUnreadable(t *testing.T) {
	good := "../../internal/profile/testdata/good-design.json"
	goodTenants, badTenants := "../../internal/tenant/testdata/good.json", "../../internal/tenant/testdata/bad-many.json"
	badErrors, err := os.ReadFile("../../internal/tenant/testdata/bad-many.errors")
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "nope.json")
	const help = "usage: poold check [PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE]\n\nFlags:\n" +
		"      --tenants string        a tenants file to validate (docs/tenancy.md)\n" +
		"      --config string         the settings file that vllm-command is read from, as serve reads it; default /etc/poold/poold.yaml when it exists\n" +
		"      --vllm-command string   the vllm-command that serve runs with, whose engine binary is checked; else from POOLD_VLLM_COMMAND or the settings file, as serve reads it (default \"vllm serve\")\n"
	for _, tt := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{good}, 0, good + ": ok\n", ""},
		{[]string{missing}, 2, "", `poold check: reading profiles "` + missing + `": open ` + missing + ": no such file or directory\n"},
		{[]string{t.TempDir()}, 2, "", ""}, // a directory: unreadable
		{nil, 2, "", "poold check: a profiles file, a tenants file (--tenants) or both are required\nusage: poold check [PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE] (--help for more)\n"},
		{[]string{good, good}, 2, "", "poold check: a profiles file, a tenants file (--tenants) or both are required\nusage: poold check [PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE] (--help for more)\n"},
		{[]string{"--help"}, 0, help, ""},
		{[]string{"-h", good}, 0, help, ""},
		{[]string{"--strict", good}, 2, "", "poold check: unknown flag: --strict\nusage: poold check [PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE] (--help for more)\n"},
		// Tenants files, alone and beside a profiles file: the worst code.
		{[]string{"--tenants", goodTenants}, 0, goodTenants + ": ok\n", ""},
		{[]string{good, "--tenants", goodTenants}, 0, good + ": ok\n" + goodTenants + ": ok\n", ""},
		{[]string{good, "--tenants", badTenants}, 1, good + ": ok\n", badTenants + ": invalid:\n" + string(badErrors)},
		{[]string{"--tenants", missing}, 2, "", `poold check: reading tenants "` + missing + `": open ` + missing + ": no such file or directory\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := check(tt.args, profile.Host{}, "", &stdout, &stderr)
		if code != tt.code || stdout.String() != tt.stdout || (tt.stderr != "" && stderr.String() != tt.stderr) {
			t.Errorf("check(%q) = %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
		}
	}
}

// TestCheckWarnings: a valid file with problems on this host is ok, exit 0,
// with the warnings on stderr.
func TestCheckWarnings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "profiles.json")
	data := `{"pools": [{"name": "gpu0", "gpus": [0]}],
	  "profiles": [{"id": "embed", "model": "/nowhere/bge-m3", "args": ["--task", "embed"]},
	               {"id": "sim", "command": ["{poold}", "engine-sim", "--port", "{port}"]}]}`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(t.TempDir(), "poold")
	if err := os.WriteFile(self, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := profile.Host{LookPath: exec.LookPath, Stat: os.Stat}
	t.Setenv("PATH", t.TempDir()) // no vllm
	var stdout, stderr bytes.Buffer
	if code := check([]string{file}, host, self, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := file + `: warnings:
profiles[0] "embed": args[0]: vLLM no longer accepts --task; use --runner pooling, or nothing: vLLM detects pooling models
profiles[0] "embed": engine binary "vllm" (the vllm-command setting) does not resolve on this host: exec: "vllm": executable file not found in $PATH
profiles[0] "embed": model "/nowhere/bge-m3": no such file or directory on this host
`
	if stdout.String() != file+": ok\n" || stderr.String() != want {
		t.Errorf("stdout %q, stderr:\n%s\nwant:\n%s", stdout.String(), stderr.String(), want)
	}
}

// TestCheckLauncher: the engine binary of a profile without a command is
// the first word of the vllm-command setting, read as serve reads it (the
// flag, else POOLD_VLLM_COMMAND, else the settings file); an absolute path
// must be an executable file. An empty setting, or a settings file serve
// would refuse, exits 2.
func TestCheckLauncher(t *testing.T) {
	t.Setenv("POOLD_CONFIG", writeYAML(t, "{}\n"))
	t.Setenv("POOLD_VLLM_COMMAND", "") // unset
	t.Setenv("PATH", t.TempDir())      // no vllm
	dir := t.TempDir()
	file := filepath.Join(dir, "profiles.json")
	if err := os.WriteFile(file, []byte(`{"pools": [{"name": "gpu0", "gpus": [0]}], "profiles": [{"id": "m", "model": "org/m"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	python, notExec := filepath.Join(dir, "python"), filepath.Join(dir, "notes")
	if err := os.WriteFile(python, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope", "python")
	unresolved := func(bin, why string) string {
		return file + ": warnings:\nprofiles[0] \"m\": engine binary \"" + bin + "\" (the vllm-command setting) does not resolve on this host: exec: \"" + bin + "\": " + why + "\n"
	}
	host := profile.Host{LookPath: exec.LookPath, Stat: os.Stat}
	for _, tt := range []struct {
		name      string
		args, env []string // env: KEY=VALUE pairs set for the case
		code      int
		stderr    string
	}{
		{name: "the default", code: 0, stderr: unresolved("vllm", "executable file not found in $PATH")},
		{name: "a flag", args: []string{"--vllm-command", python + " -m vllm.entrypoints.openai.api_server"}, code: 0},
		{name: "a missing path", args: []string{"--vllm-command", missing + " -m x"}, code: 0,
			stderr: unresolved(missing, "stat "+missing+": no such file or directory")},
		{name: "not executable", args: []string{"--vllm-command", notExec}, code: 0, stderr: unresolved(notExec, "permission denied")},
		{name: "the environment", env: []string{"POOLD_VLLM_COMMAND=" + notExec + " serve"}, code: 0, stderr: unresolved(notExec, "permission denied")},
		{name: "the flag over the environment", args: []string{"--vllm-command=" + python}, env: []string{"POOLD_VLLM_COMMAND=" + notExec}, code: 0},
		{name: "the settings file", env: []string{"POOLD_CONFIG=" + writeYAML(t, "vllm-command: "+notExec+" serve\n")}, code: 0,
			stderr: unresolved(notExec, "permission denied")},
		{name: "a settings file named by --config", args: []string{"--config", writeYAML(t, "vllm-command: "+python+" -m vllm.entrypoints.openai.api_server\n")}, code: 0},
		{name: "empty", args: []string{"--vllm-command", " "}, code: 2, stderr: "poold check: " + errVLLMCommandEmpty.Error() + "\n"},
		{name: "a bad settings file", env: []string{"POOLD_CONFIG=" + writeYAML(t, "vllm-comand: x\n")}, code: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, kv := range tt.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := check(append([]string{file}, tt.args...), host, "/usr/bin/poold", &stdout, &stderr)
			if code != tt.code || tt.code == 0 && (stdout.String() != file+": ok\n" || stderr.String() != tt.stderr) ||
				tt.code == 2 && (stdout.Len() != 0 || tt.stderr != "" && stderr.String() != tt.stderr) {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit %d and stderr:\n%s", code, stdout.String(), stderr.String(), tt.code, tt.stderr)
			}
			if tt.name == "a bad settings file" && !strings.Contains(stderr.String(), `unknown key "vllm-comand"`) {
				t.Errorf("stderr %q names not the unknown key", stderr.String())
			}
		})
	}
}

func TestHashKey(t *testing.T) {
	const want = "sha256:f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4" // key-a in the tenant package's testdata
	var stdout, stderr bytes.Buffer
	if code := hashKey([]string{"key-a"}, strings.NewReader(""), &stdout, &stderr); code != 0 || stdout.String() != want+"\n" {
		t.Fatalf("hash-key key-a: %d %q %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := hashKey(nil, strings.NewReader("key-a\n\n  key-a  \n"), &stdout, &stderr); code != 0 || stdout.String() != want+"\n"+want+"\n" {
		t.Fatalf("hash-key from stdin: %d %q %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := hashKey(nil, strings.NewReader(""), &stdout, &stderr); code != 2 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "no key") {
		t.Fatalf("hash-key without a key: %d %q %q", code, stdout.String(), stderr.String())
	}
}

// TestCheckWarnsOfIdleSleep: a profile whose engine sleeps by itself once
// idle is valid, exit 0, with a warning saying what it costs.
func TestCheckWarnsOfIdleSleep(t *testing.T) {
	file := filepath.Join(t.TempDir(), "profiles.json")
	data := `{"pools": [{"name": "gpu0", "gpus": [0]}],
	  "profiles": [{"id": "sim", "command": ["{poold}", "engine-sim", "--port", "{port}", "--enable-sleep-mode", "--sim-idle-sleep", "5m"]}]}`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(t.TempDir(), "poold")
	if err := os.WriteFile(self, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := check([]string{file}, profile.Host{LookPath: exec.LookPath, Stat: os.Stat}, self, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := file + `: warnings:` + "\n" + `profiles[0] "sim": command[5]: --sim-idle-sleep makes the engine sleep by itself once idle: poold notices it`
	if stdout.String() != file+": ok\n" || !strings.HasPrefix(stderr.String(), want) || !strings.Contains(stderr.String(), "wakes it itself") {
		t.Errorf("stdout %q, stderr:\n%s\nwant it to start:\n%s", stdout.String(), stderr.String(), want)
	}
}
