package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/statusapi"
)

// engineCollector re-exports, at scrape time, each pool's awake engine's
// own load (statusapi.EngineStats), so that a dashboard needs no scrape of
// the loopback engines. A pool without a recent sample exports none.
type engineCollector struct {
	pools func() []statusapi.Pool
}

var (
	engineRunningDesc = prometheus.NewDesc("poold_engine_requests_running", "Requests in the awake engine's running batch, as the engine reports (vllm:num_requests_running).", []string{"pool", "profile"}, nil)
	engineWaitingDesc = prometheus.NewDesc("poold_engine_requests_waiting", "Requests queued inside the awake engine, as the engine reports (vllm:num_requests_waiting).", []string{"pool", "profile"}, nil)
	engineKVDesc      = prometheus.NewDesc("poold_engine_kv_cache_usage_ratio", "Share of the awake engine's KV cache in use, 0 to 1 (vllm:kv_cache_usage_perc).", []string{"pool", "profile"}, nil)
	enginePrefixDesc  = prometheus.NewDesc("poold_engine_prefix_cache_hit_ratio", "Share of prompt tokens the awake engine found in its prefix cache, over about the last minute; absent when it looked none up.", []string{"pool", "profile"}, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- engineRunningDesc
	ch <- engineWaitingDesc
	ch <- engineKVDesc
	ch <- enginePrefixDesc
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		st := p.EngineStats
		if st == nil || p.Engine == nil {
			continue
		}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, p.Name, p.Engine.Profile)
		}
		gauge(engineRunningDesc, float64(st.Running))
		gauge(engineWaitingDesc, float64(st.Waiting))
		gauge(engineKVDesc, st.KVCacheUsage)
		if st.PrefixCacheHitRate != nil {
			gauge(enginePrefixDesc, *st.PrefixCacheHitRate)
		}
	}
}
