// Package enginestats reads how loaded each awake engine is, from the
// engine's own Prometheus metrics (vLLM's vllm:* series): requests running
// and waiting, KV cache use and prefix-cache hits. Parse turns one /metrics
// body into Stats; a Scraper samples every pool's awake engine on an
// interval and fills each pool's engineStats in /status; it also tells
// when an engine says it sleeps (vllm:engine_sleep_state), as the newest
// vLLM servers' idle sleep puts one to sleep without a call from poold.
package enginestats

import (
	"errors"
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Stats is what one engine's /metrics said at one moment. A data-parallel
// engine reports each of its engine cores under its own "engine" label:
// Running, Waiting and the prefix-cache counters are their sums, and
// KVCacheUsage the fullest one's.
type Stats struct {
	// Running and Waiting are the requests in the engine's running batch
	// and in its own queue (vllm:num_requests_running, _waiting).
	Running, Waiting int
	// KVCacheUsage is the share of the KV cache in use, 0 to 1
	// (vllm:kv_cache_usage_perc, or the older vllm:gpu_cache_usage_perc).
	KVCacheUsage float64
	// PrefixQueries and PrefixHits are the engine's running totals of
	// prompt tokens looked up in the prefix cache and found there
	// (vllm:prefix_cache_queries_total, _hits_total); HasPrefixCounters
	// says whether it exports them.
	PrefixQueries, PrefixHits float64
	HasPrefixCounters         bool
	// PrefixHitRate is the hit rate an older vLLM reports itself
	// (vllm:gpu_prefix_cache_hit_rate), when it exports no counters;
	// HasPrefixHitRate says whether it does.
	PrefixHitRate    float64
	HasPrefixHitRate bool
	// SleepLevel is the sleep level the engine reports
	// (vllm:engine_sleep_state): 1 or 2 while it sleeps, 0 while it is
	// awake or when it exports no sleep state. An engine core whose
	// "awake" sample is 0 sleeps, at level 2 when its "discard_all"
	// sample is 1, else at level 1; a data-parallel engine sleeps when
	// any of its cores does, at the deepest of their levels.
	SleepLevel int
}

// The vLLM series read, in each spelling vLLM has used.
const (
	running       = "vllm:num_requests_running"
	waiting       = "vllm:num_requests_waiting"
	kvUsage       = "vllm:kv_cache_usage_perc"
	kvUsageOld    = "vllm:gpu_cache_usage_perc"
	prefixQueries = "vllm:prefix_cache_queries_total"
	prefixHits    = "vllm:prefix_cache_hits_total"
	prefixRateOld = "vllm:gpu_prefix_cache_hit_rate"
	sleepState    = "vllm:engine_sleep_state"
)

// ErrNotVLLM is returned by Parse for metrics that lack one of vLLM's
// load series (running, waiting, KV cache use): an engine that is not
// vLLM, or a version that renamed them.
var ErrNotVLLM = errors.New("not vLLM's metrics")

// Parse reads a /metrics body in Prometheus's text format. It fails on a
// body that does not parse, and with ErrNotVLLM on one without vLLM's
// running, waiting and KV cache series.
func Parse(r io.Reader) (Stats, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Stats{}, fmt.Errorf("parsing engine metrics: %w", err)
	}
	var st Stats
	var ok bool
	var missing []string
	sum := func(name string) float64 {
		v, found := fold(mfs[name], false)
		if !found {
			missing = append(missing, name)
		}
		return v
	}
	st.Running = int(sum(running))
	st.Waiting = int(sum(waiting))
	if st.KVCacheUsage, ok = fold(mfs[kvUsage], true); !ok {
		if st.KVCacheUsage, ok = fold(mfs[kvUsageOld], true); !ok {
			missing = append(missing, kvUsage)
		}
	}
	if len(missing) > 0 {
		return Stats{}, fmt.Errorf("%w: no %v", ErrNotVLLM, missing)
	}
	q, okQ := fold(mfs[prefixQueries], false)
	h, okH := fold(mfs[prefixHits], false)
	if okQ && okH {
		st.PrefixQueries, st.PrefixHits, st.HasPrefixCounters = q, h, true
	} else if v, found := fold(mfs[prefixRateOld], true); found {
		st.PrefixHitRate, st.HasPrefixHitRate = v, true
	}
	st.SleepLevel = sleepLevel(mfs[sleepState])
	return st, nil
}

// sleepLevel reads vllm:engine_sleep_state, one sample per engine core and
// state (label sleep_state: "awake", "weights_offloaded" for level 1,
// "discard_all" for level 2, each 1 or 0): the deepest level of a core
// whose "awake" is 0, 0 when every core is awake or mf is nil.
func sleepLevel(mf *dto.MetricFamily) int {
	type core struct{ asleep, discarded bool }
	cores := make(map[string]*core)
	for _, m := range mf.GetMetric() {
		var state, engine string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "sleep_state":
				state = l.GetValue()
			case "engine":
				engine = l.GetValue()
			}
		}
		c := cores[engine]
		if c == nil {
			c = new(core)
			cores[engine] = c
		}
		switch v := value(m); state {
		case "awake":
			c.asleep = v == 0
		case "discard_all":
			c.discarded = v == 1
		}
	}
	level := 0
	for _, c := range cores {
		switch {
		case c.asleep && c.discarded:
			level = 2
		case c.asleep:
			level = max(level, 1)
		}
	}
	return level
}

// fold returns the sum (or with largest, the largest) of a family's
// samples, and whether it has any.
func fold(mf *dto.MetricFamily, largest bool) (float64, bool) {
	if mf == nil || len(mf.GetMetric()) == 0 {
		return 0, false
	}
	var out float64
	for i, m := range mf.GetMetric() {
		v := value(m)
		switch {
		case !largest:
			out += v
		case i == 0 || v > out:
			out = v
		}
	}
	return out, true
}

// value is a gauge's, counter's or untyped sample's value.
func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}
