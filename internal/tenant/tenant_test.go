package tenant

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/bad-*.errors from the current output")

// Every bad-*.json is refused with every problem and its JSON path, exactly
// as its bad-*.errors says; no key in clear is ever echoed.
func TestGoldenErrors(t *testing.T) {
	files, err := filepath.Glob("testdata/bad-*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(data)
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			got := err.Error() + "\n"
			if strings.Contains(got, "key-in-clear") {
				t.Fatalf("a key in clear is echoed: %s", got)
			}
			golden := strings.TrimSuffix(file, ".json") + ".errors"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("errors:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestGood(t *testing.T) {
	c, _, err := Load("testdata/good.json")
	if err != nil {
		t.Fatal(err)
	}
	a := c.Lookup("key-a")
	if a == nil || a.Name != "team-a" || a.Weight() != 10 || a.Background() || a.RPM != 600 || a.MaxOutputTokens != 8192 {
		t.Fatalf("key-a: %+v", a)
	}
	if n := c.Lookup("key-c"); n == nil || !n.Background() || n.Weight() != 1 {
		t.Fatalf("key-c: %+v", n)
	}
	if c.Lookup("key-z") != nil || c.Lookup("") != nil {
		t.Fatal("an unknown or empty key found a tenant")
	}
	if c.Tenant("team-b") != c.Lookup("key-b") {
		t.Fatal("Tenant and Lookup disagree")
	}
	// team-b's maxKeepAlive bounds what its requests ask, and "as long as
	// allowed"; team-a has none.
	for _, tc := range []struct {
		tenant   string
		ask, got time.Duration
	}{
		{"team-b", time.Minute, time.Minute},
		{"team-b", time.Hour, 10 * time.Minute},
		{"team-b", -1, 10 * time.Minute},
		{"team-b", 0, 0},
		{"team-a", time.Hour, time.Hour},
		{"team-a", -1, -1},
	} {
		if got := c.Tenant(tc.tenant).KeepAlive(tc.ask); got != tc.got {
			t.Errorf("%s: KeepAlive(%v) = %v, want %v", tc.tenant, tc.ask, got, tc.got)
		}
	}
	for _, tc := range []struct {
		names []string
		want  bool
	}{
		{[]string{"qwen2.5-7b-instruct"}, true},
		{[]string{"chat", "qwen2.5-7b-instruct"}, true}, // an alias of an allowed id
		{[]string{"bge-m3"}, true},
		{[]string{"llama-3.1-8b"}, false},
		{[]string{"bge-m3-large"}, false},
	} {
		if got := a.AllowsModel(tc.names...); got != tc.want {
			t.Errorf("team-a AllowsModel(%v) = %v", tc.names, got)
		}
	}
	if !c.Lookup("key-b").AllowsModel("anything") {
		t.Error("a tenant without models may not use one")
	}
	for pool, want := range map[string]bool{"gpu1": true, "batch-a100": true, "gpu0": false, "gpu10": false, "": false} {
		if got := a.AllowsPool(pool); got != want {
			t.Errorf("team-a AllowsPool(%q) = %v", pool, got)
		}
	}
	if c.Lookup("key-b").AllowsPool("gpu1") {
		t.Error("a tenant without pools may swap one")
	}
}

func TestHashKey(t *testing.T) {
	c, _, err := Load("testdata/good.json")
	if err != nil {
		t.Fatal(err)
	}
	if h := HashKey("key-a"); h != c.Tenant("team-a").Keys[0] {
		t.Fatalf("HashKey = %s", h)
	}
}

func TestNilConfig(t *testing.T) {
	var c *Config
	if c.Lookup("x") != nil || c.Tenant("x") != nil {
		t.Fatal("a nil config found a tenant")
	}
}

func TestDiff(t *testing.T) {
	prev, _, err := Load("testdata/good.json")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile("testdata/good.json")
	edited := strings.Replace(strings.Replace(string(data), `"rpm": 60,`, `"rpm": 120,`, 1), `{"name": "nightly"`, `{"name": "nightly-2"`, 1)
	edited = strings.Replace(edited, `"pools": ["gpu1", "batch-*"]`, `"pools": ["gpu1"]`, 1)
	next, err := Parse([]byte(edited))
	if err != nil {
		t.Fatal(err)
	}
	added, removed, changed := Diff(prev, next)
	if strings.Join(added, ",") != "nightly-2" || strings.Join(removed, ",") != "nightly" || strings.Join(changed, ",") != "team-a,team-b" {
		t.Fatalf("added %v, removed %v, changed %v", added, removed, changed)
	}
	if a, r, c := Diff(nil, prev); len(a) != 3 || r != nil || c != nil {
		t.Fatalf("from no file: %v %v %v", a, r, c)
	}
	if a, r, c := Diff(prev, prev); a != nil || r != nil || c != nil {
		t.Fatalf("no change: %v %v %v", a, r, c)
	}
}
