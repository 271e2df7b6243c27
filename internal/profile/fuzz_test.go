package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics and returns either a valid, usable config or
// errors, never both or neither. Seeds: every file in testdata (good and bad)
// plus the corpus in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c != nil, err)
		}
		if err != nil {
			for line := range strings.Lines(err.Error()) {
				if strings.TrimSpace(line) == "" {
					t.Fatalf("an empty line in the errors: %q", err)
				}
			}
			return
		}
		checkUsable(t, c)
		// Deterministic: the same bytes give the same names.
		again, err := Parse(data)
		if err != nil || strings.Join(again.Names(), ",") != strings.Join(c.Names(), ",") {
			t.Fatalf("second Parse differs: %v", err)
		}
	})
}

// checkUsable asserts what the rest of poold relies on in a valid config.
func checkUsable(t *testing.T, c *Config) {
	t.Helper()
	if len(c.Pools) == 0 {
		t.Fatal("valid config without pools")
	}
	for _, spec := range c.Pools {
		if c.Pool(spec.Name) != spec || len(spec.GPUs) == 0 {
			t.Fatalf("pool %q: not indexed or without GPUs", spec.Name)
		}
		if spec.Default != "" && c.Lookup(spec.Default) == nil {
			t.Fatalf("pool %q: default %q does not resolve", spec.Name, spec.Default)
		}
		if spec.MaxQueue <= 0 || spec.MaxQueueWait.Duration <= 0 || spec.MinResidency.Duration < 0 {
			t.Fatalf("pool %q: defaults not applied: %+v", spec.Name, spec)
		}
	}
	for _, p := range c.Profiles {
		for _, name := range append([]string{p.ID}, p.Aliases...) {
			if c.Lookup(name) != p {
				t.Fatalf("name %q does not resolve to profile %q", name, p.ID)
			}
		}
		if p.StartupTimeout.Duration <= 0 || p.StopTimeout.Duration < 0 {
			t.Fatalf("profile %q: timeouts %v %v", p.ID, p.StartupTimeout, p.StopTimeout)
		}
		if len(p.Pools) == 0 {
			t.Fatalf("profile %q: no eligible pool after Parse", p.ID)
		}
		for _, name := range p.Pools {
			spec := c.Pool(name)
			if spec == nil {
				t.Fatalf("profile %q: pool %q does not exist", p.ID, name)
			}
			if argv := p.Argv(41000, spec, Launch{Self: "/usr/bin/poold"}); len(argv) == 0 || argv[0] == "" {
				t.Fatalf("profile %q: empty argv", p.ID)
			}
			_ = p.Environ(spec)
		}
	}
}
