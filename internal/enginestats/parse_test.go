package enginestats

import (
	"errors"
	"fmt"
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

func TestParseSleepState(t *testing.T) {
	const load = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n# TYPE vllm:engine_sleep_state gauge\n"
	state := func(engine string, awake, offloaded, discarded int) string {
		return fmt.Sprintf("vllm:engine_sleep_state{engine=%q,sleep_state=\"awake\"} %d\n", engine, awake) +
			fmt.Sprintf("vllm:engine_sleep_state{engine=%q,sleep_state=\"weights_offloaded\"} %d\n", engine, offloaded) +
			fmt.Sprintf("vllm:engine_sleep_state{engine=%q,sleep_state=\"discard_all\"} %d\n", engine, discarded)
	}
	for _, tt := range []struct {
		name, body string
		want       int
	}{
		{"no sleep state (an older vLLM)", "", 0},
		{"awake", state("0", 1, 0, 0), 0},
		{"level 1", state("0", 0, 1, 0), 1},
		{"level 2", state("0", 0, 0, 1), 2},
		{"asleep, level not said", state("0", 0, 0, 0), 1},
		{"one data-parallel core asleep", state("0", 1, 0, 0) + state("1", 0, 1, 0), 1},
		{"the deepest core's level", state("0", 0, 1, 0) + state("1", 0, 0, 1), 2},
	} {
		st, err := Parse(strings.NewReader(load + tt.body))
		if err != nil || st.SleepLevel != tt.want {
			t.Errorf("%s: sleep level %d, %v; want %d", tt.name, st.SleepLevel, err, tt.want)
		}
	}
}
