package enginestats

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		file string
		want Stats
	}{
		// Two data-parallel engine cores: counts and counters add up, the
		// fuller KV cache is the engine's.
		{"vllm-v1.txt", Stats{Running: 12, Waiting: 4, KVCacheUsage: 0.8125, PrefixQueries: 4000, PrefixHits: 2000, HasPrefixCounters: true}},
		// The older spellings: gpu_cache_usage_perc and a hit-rate gauge.
		{"vllm-v0.txt", Stats{Running: 2, Waiting: 12, KVCacheUsage: 0.97, PrefixHitRate: 0.25, HasPrefixHitRate: true}},
	} {
		f, err := os.Open("testdata/" + tt.file)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(f)
		f.Close()
		if err != nil || got != tt.want {
			t.Errorf("Parse(%s) = %+v, %v; want %+v", tt.file, got, err, tt.want)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	f, err := os.Open("testdata/not-vllm.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Parse(f)
	if !errors.Is(err, ErrNotVLLM) || !strings.Contains(err.Error(), waiting) || !strings.Contains(err.Error(), kvUsage) {
		t.Errorf("metrics without waiting and KV cache: err = %v, want ErrNotVLLM naming both", err)
	}

	bad, err := os.ReadFile("testdata/malformed.txt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(strings.NewReader(string(bad))); err == nil || errors.Is(err, ErrNotVLLM) {
		t.Errorf("malformed metrics: err = %v, want a parse error", err)
	}
	if _, err := Parse(strings.NewReader("")); !errors.Is(err, ErrNotVLLM) {
		t.Errorf("empty body: err = %v, want ErrNotVLLM", err)
	}
}
