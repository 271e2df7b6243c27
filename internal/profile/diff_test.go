package profile

import (
	"reflect"
	"strings"
	"testing"
)

func mustParse(t *testing.T, s string) *Config {
	t.Helper()
	c, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestDiff(t *testing.T) {
	const base = `{
	  "pools": [{"name": "p0", "gpus": [0], "default": "a"}, {"name": "p1", "gpus": [1]}, {"name": "p2", "gpus": [2]}],
	  "defaults": {"stopTimeout": "10s"},
	  "profiles": [
	    {"id": "a", "model": "m", "pools": ["p0"]},
	    {"id": "b", "model": "m", "aliases": ["bee"], "pools": ["p1"]},
	    {"id": "c", "model": "m", "pools": ["p2"]}
	  ]}`
	old := mustParse(t, base)
	for _, tt := range []struct {
		name string
		cur  string
		want Changes
	}{
		{"the same file, written differently", strings.ReplaceAll(strings.Replace(base, `"10s"`, `"10000ms"`, 1), "\n", " "), Changes{}},
		{"a profile added", strings.Replace(base, `{"id": "c"`, `{"id": "d", "model": "m", "pools": ["p2"]}, {"id": "c"`, 1),
			Changes{ProfilesAdded: []string{"d"}, PoolsAffected: []string{"p2"}}},
		{"a profile removed", strings.Replace(base, `{"id": "b", "model": "m", "aliases": ["bee"], "pools": ["p1"]},`, "", 1),
			Changes{ProfilesRemoved: []string{"b"}, PoolsAffected: []string{"p1"}}},
		{"a profile moved to another pool", strings.Replace(base, `"id": "c", "model": "m", "pools": ["p2"]`, `"id": "c", "model": "m", "pools": ["p1"]`, 1),
			Changes{ProfilesChanged: []string{"c"}, PoolsAffected: []string{"p1", "p2"}}},
		{"an alias becomes a profile", strings.Replace(strings.Replace(base, `"aliases": ["bee"], `, "", 1), `{"id": "c"`, `{"id": "bee", "model": "m", "pools": ["p0"]}, {"id": "c"`, 1),
			Changes{ProfilesAdded: []string{"bee"}, ProfilesChanged: []string{"b"}, PoolsAffected: []string{"p0", "p1"}}},
		{"a default that applies to profiles", strings.Replace(base, `"stopTimeout": "10s"`, `"stopTimeout": "20s"`, 1),
			Changes{ProfilesChanged: []string{"a", "b", "c"}, PoolsAffected: []string{"p0", "p1", "p2"}}},
		{"a passEnv", strings.Replace(base, `"stopTimeout": "10s"`, `"stopTimeout": "10s", "passEnv": ["HTTPS_PROXY"]`, 1),
			Changes{ProfilesChanged: []string{"a", "b", "c"}, PoolsAffected: []string{"p0", "p1", "p2"}}},
		{"pools added, removed and changed", strings.NewReplacer(`{"name": "p2", "gpus": [2]}`, `{"name": "p3", "gpus": [3]}`, `"default": "a"`, `"maxQueue": 3`, `"pools": ["p2"]`, `"pools": ["p3"]`).Replace(base),
			Changes{ProfilesChanged: []string{"c"}, PoolsAdded: []string{"p3"}, PoolsRemoved: []string{"p2"}, PoolsChanged: []string{"p0"}, PoolsAffected: []string{"p0", "p3", "p2"}}},
		{"the host's sleep budget", strings.Replace(base, `"stopTimeout": "10s"`, `"stopTimeout": "10s", "sleepMemoryBudget": 1000`, 1),
			Changes{SleepMemoryBudget: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Diff(old, mustParse(t, tt.cur))
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Diff:\n got %+v\nwant %+v", got, tt.want)
			}
			if got.None() != reflect.DeepEqual(tt.want, Changes{}) {
				t.Fatalf("None() = %v for %+v", got.None(), got)
			}
		})
	}
}

func TestDiffFromNothing(t *testing.T) {
	cur := mustParse(t, `{"pools": [{"name": "p0", "gpus": [0]}], "profiles": [{"id": "a", "model": "m"}]}`)
	want := Changes{ProfilesAdded: []string{"a"}, PoolsAdded: []string{"p0"}, PoolsAffected: []string{"p0"}}
	if got := Diff(nil, cur); !reflect.DeepEqual(got, want) {
		t.Fatalf("Diff(nil, cur) = %+v, want %+v", got, want)
	}
}
