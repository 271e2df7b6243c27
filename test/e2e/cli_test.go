package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runCLI runs a built binary to completion (bounded by a minute) and returns
// its exit code and output.
func runCLI(t *testing.T, env []string, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %q: %v", bin, args, err)
	}
	return code, out.String(), errOut.String()
}

// Help, version and usage errors of both binaries: help and version exit 0
// on stdout, every subcommand answers --help with its own usage, and an
// unknown command or flag exits 2 with the error on stderr.
func TestCLIHelpAndVersion(t *testing.T) {
	for _, tt := range []struct {
		bin    string
		args   []string
		code   int
		stdout []string // each must appear on stdout
		stderr string   // must appear on stderr
	}{
		{bin: pooldBin, args: []string{"--help"}, stdout: []string{"\n  poold [serve] [flags]", "\n  poold check [PROFILES] [--tenants FILE]", "\n  poold status [--addr ADDR] [--json]",
			"\n  poold engine-sim ", "\n  poold version", "\n  poold help [COMMAND]", "Flags of serve", "--profiles string", "--shutdown-timeout duration"}},
		{bin: pooldBin, args: []string{"-h"}, stdout: []string{"\n  poold check [PROFILES] [--tenants FILE]"}},
		{bin: pooldBin, args: []string{"help"}, stdout: []string{"\n  poold check [PROFILES] [--tenants FILE]"}},
		{bin: pooldBin, args: []string{"--version"}, stdout: []string{"poold "}},
		{bin: pooldBin, args: []string{"version"}, stdout: []string{"poold "}},
		{bin: pooldBin, args: []string{"serve", "--help"}, stdout: []string{"usage: poold serve [flags]", "--listen string"}},
		{bin: pooldBin, args: []string{"check", "--help"}, stdout: []string{"usage: poold check [PROFILES] [--tenants FILE]"}},
		{bin: pooldBin, args: []string{"help", "check"}, stdout: []string{"usage: poold check [PROFILES] [--tenants FILE]"}},
		{bin: pooldBin, args: []string{"status", "--help"}, stdout: []string{"usage: poold status [--addr ADDR] [--json]", "--addr string"}},
		{bin: pooldBin, args: []string{"engine-sim", "--help"}, stdout: []string{"usage: poold engine-sim"}},
		{bin: pooldBin, args: []string{"bogus"}, code: 2, stderr: `poold: unknown command "bogus"`},
		{bin: pooldBin, args: []string{"--bogus"}, code: 2, stderr: "unknown flag: --bogus"},
		{bin: pooldBin, args: []string{"status", "--bogus"}, code: 2, stderr: "poold status: unknown flag: --bogus"},
		{bin: pooldBin, args: []string{"check"}, code: 2, stderr: "usage: poold check [PROFILES] [--tenants FILE]"},

		{bin: fleetdBin, args: []string{"--help"}, stdout: []string{"\n  fleetd [serve] [flags]", "\n  fleetd check [--tenants TENANTS] [HOSTS]",
			"\n  fleetd status [--addr ADDR] [--json]", "\n  fleetd version", "\n  fleetd help [COMMAND]", "Flags of serve", "--hosts string"}},
		{bin: fleetdBin, args: []string{"-h"}, stdout: []string{"\n  fleetd check [--tenants TENANTS] [HOSTS]"}},
		{bin: fleetdBin, args: []string{"help"}, stdout: []string{"\n  fleetd check [--tenants TENANTS] [HOSTS]"}},
		{bin: fleetdBin, args: []string{"--version"}, stdout: []string{"fleetd "}},
		{bin: fleetdBin, args: []string{"version"}, stdout: []string{"fleetd "}},
		{bin: fleetdBin, args: []string{"serve", "-h"}, stdout: []string{"usage: fleetd serve [flags]", "--poll-interval duration"}},
		{bin: fleetdBin, args: []string{"check", "--help"}, stdout: []string{"usage: fleetd check [--tenants TENANTS] [HOSTS]"}},
		{bin: fleetdBin, args: []string{"check"}, code: 2, stderr: "usage: fleetd check [--tenants TENANTS] [HOSTS]"},
		{bin: fleetdBin, args: []string{"status", "--help"}, stdout: []string{"usage: fleetd status [--addr ADDR] [--json]"}},
		{bin: fleetdBin, args: []string{"bogus"}, code: 2, stderr: `fleetd: unknown command "bogus"`},
		{bin: fleetdBin, args: []string{"--bogus"}, code: 2, stderr: "unknown flag: --bogus"},
	} {
		code, stdout, stderr := runCLI(t, nil, tt.bin, tt.args...)
		name := tt.bin[strings.LastIndexByte(tt.bin, '/')+1:] + " " + strings.Join(tt.args, " ")
		if code != tt.code {
			t.Errorf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", name, code, tt.code, stdout, stderr)
			continue
		}
		for _, want := range tt.stdout {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s: stdout lacks %q:\n%s", name, want, stdout)
			}
		}
		if tt.code == 0 && stderr != "" {
			t.Errorf("%s: stderr %q, want nothing", name, stderr)
		}
		if tt.code != 0 && (stdout != "" || !strings.Contains(stderr, tt.stderr)) {
			t.Errorf("%s: stdout %q, stderr %q; want nothing and %q", name, stdout, stderr, tt.stderr)
		}
	}
}

// poold status and fleetd status each read their own daemon, at host:port or
// at a URL, and name the other daemon when pointed at it.
func TestStatusCommandsNameTheirDaemon(t *testing.T) {
	d := startPoold(t, t.Name(), hostProfiles(t.Name(), "", []string{"a"}))
	f := startFleetd(t, []*daemon{d})
	pooldAddr, fleetdAddr := strings.TrimPrefix(d.url, "http://"), strings.TrimPrefix(f.url, "http://")
	for _, tt := range []struct {
		bin, addr string
		code      int
		stdout    string // on stdout when the exit is 0, else on stderr
	}{
		{pooldBin, pooldAddr, 0, "\ngpu0 "},
		{pooldBin, d.url + "/", 0, "\ngpu0 "},
		{fleetdBin, fleetdAddr, 0, "\nhost1 "},
		{fleetdBin, f.url, 0, "\nhost1 "},
		{pooldBin, fleetdAddr, 1, "poold status: " + f.url + " is a fleetd (version dev), not a poold; run: fleetd status --addr " + f.url + "\n"},
		{fleetdBin, d.url, 1, "fleetd status: " + d.url + " is a poold (version dev), not a fleetd; run: poold status --addr " + d.url + "\n"},
	} {
		code, stdout, stderr := runCLI(t, nil, tt.bin, "status", "--addr", tt.addr)
		got := stdout
		if tt.code != 0 {
			got = stderr
		}
		if code != tt.code || !strings.Contains(got, tt.stdout) {
			t.Errorf("%s status --addr %s: exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d and %q", tt.bin, tt.addr, code, stdout, stderr, tt.code, tt.stdout)
		}
	}
}

// fleetd status shows a host that fleetd ejected as ejected, with the reason,
// and without the pools of its last good poll: here poold came back on the
// same address requiring API keys that fleetd does not present.
func TestFleetdStatusShowsEjectedHost(t *testing.T) {
	tag := t.Name()
	profiles := hostProfiles(tag, "a", []string{"a"})
	d := startPoold(t, tag, profiles)
	d.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	f := startFleetd(t, []*daemon{d})
	d.stop()
	keys := filepath.Join(t.TempDir(), "keys")
	writeFile(t, keys, []byte("sk-not-fleetds\n"))
	launch(t, tag, profiles, "--listen", strings.TrimPrefix(d.url, "http://"), "--api-keys-file", keys)

	var stdout string
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stdout, "401 Unauthorized") || !strings.Contains(stdout, " ejected ") {
		if time.Now().After(deadline) {
			t.Fatalf("fleetd status never showed the host ejected for its 401:\n%s", stdout)
		}
		time.Sleep(50 * time.Millisecond)
		var code int
		var stderr string
		if code, stdout, stderr = runCLI(t, nil, fleetdBin, "status", "--addr", f.url); code != 0 {
			t.Fatalf("fleetd status: exit %d: %s", code, stderr)
		}
	}
	var rows []string
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "host1 ") {
			rows = append(rows, line)
		}
	}
	if want := "/v1/models: status 401 Unauthorized"; len(rows) != 1 || !strings.Contains(rows[0], " ejected ") || !strings.HasSuffix(rows[0], want) || strings.Contains(rows[0], "ready") {
		t.Fatalf("host1 rows %q, want one: ejected, no pool, ending %q\n%s", rows, want, stdout)
	}
}

// make build puts both binaries in BIN, each reporting VERSION and the
// commit, even where Go's VCS stamping is off, and prints nothing but its
// command.
func TestMakeBuildStampsBothBinaries(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", "../..", "build", "BIN="+bin, "VERSION=v9.8.7-e2e", "COMMIT=0123abc")
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("make build: %v, output:\n%s", err, out)
	}
	for _, name := range []string{"poold", "fleetd"} {
		code, stdout, stderr := runCLI(t, nil, filepath.Join(bin, name), "--version")
		if code != 0 || stdout != name+" v9.8.7-e2e (0123abc)\n" {
			t.Errorf("%s --version: exit %d, %q %q", name, code, stdout, stderr)
		}
	}
}

// Settings from the environment and the settings file are parsed as strictly
// as flags: a bad one stops poold or fleetd with exit 2 before anything
// starts, naming the key and its source.
func TestSettingsStrictExit2(t *testing.T) {
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles.json")
	writeFile(t, profiles, profilesJSON(t.Name(), []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "a"}}, nil))
	typo := filepath.Join(dir, "poold.yaml")
	writeFile(t, typo, []byte("listne: 127.0.0.1:1\nshutdown-timeout: 300\n"))
	hosts := filepath.Join(dir, "hosts.json")
	writeFile(t, hosts, []byte(`{"hosts": [{"name": "h", "url": "http://127.0.0.1:1"}]}`))
	serve := []string{"serve", "--profiles", profiles, "--listen", freeAddr(t), "--state-dir", filepath.Join(dir, "state")}
	for _, tt := range []struct {
		bin  string
		env  []string
		args []string
		want []string // lines of stderr
	}{
		{pooldBin, []string{"POOLD_SHUTDOWN_TIMEOUT=300"}, serve,
			[]string{`poold: shutdown-timeout: environment POOLD_SHUTDOWN_TIMEOUT: invalid duration "300": a number with a unit, such as 90s, 5m or 1h30m`}},
		{pooldBin, []string{"POOLD_SHUTDOWN_TIMEOUT=abc", "POOLD_MAX_BODY_BYTES=32MiB", "POOLD_METRICS=maybe"}, serve, []string{
			`poold: shutdown-timeout: environment POOLD_SHUTDOWN_TIMEOUT: invalid duration "abc": a number with a unit, such as 90s, 5m or 1h30m`,
			`metrics: environment POOLD_METRICS: invalid boolean "maybe": true or false`}},
		{pooldBin, []string{"POOLD_CONFIG=" + typo}, serve, []string{
			`poold: settings file ` + typo + `: unknown key "listne"`,
			`shutdown-timeout: settings file ` + typo + `: invalid duration "300": a number with a unit, such as 90s, 5m or 1h30m`}},
		{fleetdBin, []string{"FLEETD_POLL_INTERVAL=5"}, []string{"--hosts", hosts, "--listen", freeAddr(t)},
			[]string{`fleetd: poll-interval: environment FLEETD_POLL_INTERVAL: invalid duration "5": a number with a unit, such as 90s, 5m or 1h30m`}},
	} {
		code, stdout, stderr := runCLI(t, tt.env, tt.bin, tt.args...)
		if want := strings.Join(tt.want, "\n") + "\n"; code != 2 || stdout != "" || stderr != want {
			t.Errorf("%s with %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and:\n%s", tt.bin, tt.env, code, stdout, stderr, want)
		}
	}
	if pids := taggedProcesses(t.Name()); len(pids) > 0 {
		t.Errorf("engines started: %v", pids)
	}
}

// When a setting comes from more than one source, poold logs the one that
// won, naming the key and the sources but never the values.
func TestSettingsOverrideLogged(t *testing.T) {
	file := filepath.Join(t.TempDir(), "poold.yaml")
	writeFile(t, file, []byte("reload-debounce: 1s\nadmin-token: tok-from-the-file\n"))
	t.Setenv("POOLD_RELOAD_DEBOUNCE", "300ms")
	t.Setenv("POOLD_ADMIN_TOKEN", "tok-from-the-env")
	d := startPoold(t, t.Name(), profilesJSON(t.Name(), []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "a"}}, nil), "--config", file)
	logs := d.stderr.String()
	for _, want := range []string{
		`"msg":"settings file read","path":"` + file + `"`,
		`"msg":"setting overridden","key":"reload-debounce","from":"environment POOLD_RELOAD_DEBOUNCE","overrides":"settings file ` + file + `"`,
		`"msg":"setting overridden","key":"admin-token","from":"environment POOLD_ADMIN_TOKEN","overrides":"settings file ` + file + `"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if strings.Contains(logs, "tok-from-the") {
		t.Errorf("a token's value is in the log")
	}
}

// poold check warns, exit 0, about what would fail on this host in a valid
// file: a flag vLLM removed, vllm missing from PATH, a model path that does
// not exist. {poold} resolves to poold itself. Errors still exit 1.
func TestCheckWarnsAboutThisHost(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "profiles.json")
	writeFile(t, good, []byte(`{"pools": [{"name": "gpu0", "gpus": [0]}],
	  "profiles": [
	    {"id": "embed", "model": "`+dir+`/models/bge-m3", "args": ["--task", "embed"]},
	    {"id": "sim", "command": ["{poold}", "engine-sim", "--port", "{port}"]}]}`))
	code, stdout, stderr := runCLI(t, []string{"PATH=" + dir}, pooldBin, "check", good)
	want := good + `: warnings:
profiles[0] "embed": args[0]: vLLM no longer accepts --task; use --runner pooling, or nothing: vLLM detects pooling models
profiles[0] "embed": engine binary "vllm" (the vllm-command setting) does not resolve on this host: exec: "vllm": executable file not found in $PATH
profiles[0] "embed": model "` + dir + `/models/bge-m3": no such file or directory on this host
`
	if code != 0 || stdout != good+": ok\n" || stderr != want {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit 0 and:\n%s", code, stdout, stderr, want)
	}

	bad := filepath.Join(dir, "bad.json")
	writeFile(t, bad, []byte(`{"pools": [{"name": "gpu0", "gpus": [0]}], "profiles": [{"id": "x", "args": ["--task", "embed"]}]}`))
	code, stdout, stderr = runCLI(t, []string{"PATH=" + dir}, pooldBin, "check", bad)
	if want := bad + ": invalid:\nprofiles[0] \"x\": model: required unless command is set\n"; code != 1 || stdout != "" || stderr != want {
		t.Errorf("bad file: exit %d, stdout %q, stderr %q; want 1 and %q", code, stdout, stderr, want)
	}
}

// make demo runs poold on the demo profiles with its state in the folder
// DEMO_STATE names (by default one of the checkout), whoever runs it, and
// Ctrl-C (SIGINT to the terminal's process group: make and poold) stops
// poold and its engines, leaving none running.
func TestMakeDemo(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	state := filepath.Join(t.TempDir(), "state")
	addr := freeAddr(t)
	d := &daemon{t: t, url: "http://" + addr, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command("make", "-s", "-C", "../..", "demo", "BIN="+t.TempDir(), "DEMO_STATE="+state, "DEMOFLAGS=--listen "+addr+" --log-format json")
	cmd.Stdout, cmd.Stderr = d.stdout, d.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	})
	// make builds first: minutes on a busy machine.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if st, err := d.fetchStatus(); err == nil && len(st.Pools) == 2 && st.Pools[0].Engine != nil && st.Pools[1].Engine != nil && st.Pools[0].State == "ready" && st.Pools[1].State == "ready" {
			break
		}
		select {
		case <-d.exited:
			t.Fatalf("make demo ended: %v\n%s%s", d.err, d.stdout.String(), d.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo's pools not ready after 5 min\n%s", d.stderr.String())
		}
	}
	var engines []int
	for _, p := range d.status().Pools {
		engines = append(engines, p.Engine.PID)
	}
	for _, f := range []string{"engines.json", "usage.db"} {
		if _, err := os.Stat(filepath.Join(state, f)); err != nil {
			t.Errorf("the demo's state folder has no %s: %v", f, err)
		}
	}
	if !strings.Contains(d.stdout.String(), "state in "+state) {
		t.Errorf("make demo does not say where its state is: %q", d.stdout.String())
	}

	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		t.Fatalf("make demo still runs a minute after Ctrl-C\n%s", d.stderr.String())
	}
	for _, pid := range engines {
		if alive(pid) {
			t.Errorf("engine %d still runs after Ctrl-C", pid)
		}
	}
	if !strings.Contains(d.stderr.String(), "stopping engines") {
		t.Errorf("poold did not say it stops its engines:\n%s", tail(d.stderr.String(), 20))
	}
}
