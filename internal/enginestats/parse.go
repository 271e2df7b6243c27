// Package enginestats reads how loaded each awake engine is, from the
// engine's own Prometheus metrics (vLLM's vllm:* series): requests running
// and waiting, KV cache use and prefix-cache hits. Parse turns one /metrics
// body into Stats; a Scraper samples every pool's awake engine on an
// interval and fills each pool's engineStats in /status.
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
	return st, nil
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
