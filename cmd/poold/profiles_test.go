package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poold/poold/internal/enginesim"
	"github.com/poold/poold/internal/profile"
)

// engineArgs returns the `vllm serve` arguments of argv (after "vllm serve"
// or "{poold} engine-sim", which takes the same flags), or false for a
// command that runs another program.
func engineArgs(argv []string, self string) ([]string, bool) {
	switch {
	case len(argv) >= 2 && argv[0] == "vllm" && argv[1] == "serve",
		len(argv) >= 2 && argv[0] == self && argv[1] == "engine-sim":
		return argv[2:], true
	}
	return nil, false
}

// checkArgv runs prof's engine argv on every pool it may use through the
// simulator's parser, which rejects what vLLM's rejects (removed flags such
// as --task among them), and returns each problem.
func checkArgv(cfg *profile.Config, prof *profile.Profile) []string {
	const self = "/usr/bin/poold"
	var problems []string
	for _, spec := range cfg.Pools {
		if !prof.EligibleOn(spec.Name) {
			continue
		}
		argv := prof.Argv(8000, spec, profile.Launch{Self: self})
		args, ok := engineArgs(argv, self)
		if !ok {
			problems = append(problems, prof.ID+": runs "+argv[0]+", neither vllm serve nor engine-sim")
			continue
		}
		if _, err := enginesim.ParseFlags(args); err != nil {
			problems = append(problems, prof.ID+" on "+spec.Name+": "+err.Error())
		}
	}
	return problems
}

// TestShippedProfilesParse: every engine command line the shipped profiles
// files give (through profile.Argv, as poold starts them) passes vLLM's
// argument parsing, as the simulator models it, and `poold check` has no
// warning about a removed flag for them.
func TestShippedProfilesParse(t *testing.T) {
	files, err := filepath.Glob("../../profiles/*.json")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		cfg, _, err := profile.Load(file)
		if err != nil {
			continue // hosts-example.json is fleetd's, not a profiles file
		}
		for _, prof := range cfg.Profiles {
			for _, p := range checkArgv(cfg, prof) {
				t.Errorf("%s: %s", filepath.Base(file), p)
			}
			checked++
		}
		var stdout, stderr bytes.Buffer
		if code := check([]string{file}, profile.Host{}, "", &stdout, &stderr); code != 0 || stderr.Len() != 0 {
			t.Errorf("poold check %s: exit %d, warnings:\n%s", file, code, stderr.String())
		}
	}
	if checked < 6 {
		t.Fatalf("checked %d shipped profiles, want at least 6 (profiles/example-vllm.json and demo.json)", checked)
	}
}

// TestArgvCheckCatchesTask: the check above fails on a profile that passes
// --task, as the shipped example did before vLLM removed it.
func TestArgvCheckCatchesTask(t *testing.T) {
	data, err := os.ReadFile("../../profiles/example-vllm.json")
	if err != nil {
		t.Fatal(err)
	}
	old := strings.ReplaceAll(string(data), `"--runner", "pooling"`, `"--task", "embed"`)
	if old == string(data) {
		t.Fatal("profiles/example-vllm.json passes no --runner pooling to replace")
	}
	cfg, err := profile.Parse([]byte(old))
	if err != nil {
		t.Fatal(err)
	}
	problems := checkArgv(cfg, cfg.Lookup("bge-m3"))
	// The model goes as --model, so that vLLM's optional positional MODEL
	// takes "embed": --task alone is unrecognized.
	if len(problems) != 1 || !strings.HasSuffix(problems[0], "unrecognized arguments: --task") {
		t.Fatalf("problems %q, want one: unrecognized arguments: --task", problems)
	}
}
