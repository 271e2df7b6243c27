package enginesim

import (
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// simMetrics holds vLLM's metrics for one simulated engine, in a private
// registry, with vLLM's names, types, labels and histogram buckets
// (vllm/v1/metrics/loggers.py): every vllm:* series but
// vllm:cache_config_info has model_name (the first served name) and engine
// ("0"). All members are safe for concurrent use.
type simMetrics struct {
	running       prometheus.Gauge
	waiting       prometheus.Gauge
	kvUsage       prometheus.Gauge
	sleepState    *prometheus.GaugeVec // by sleep_state, with model_name and engine
	promptTokens  prometheus.Counter
	genTokens     prometheus.Counter
	prefixQueries prometheus.Counter
	prefixHits    prometheus.Counter
	ttft          prometheus.Observer
	itl           prometheus.Observer
	e2e           prometheus.Observer
	queueTime     prometheus.Observer
	promptHist    prometheus.Observer    // prompt tokens per finished request
	genHist       prometheus.Observer    // generated tokens per finished request
	success       *prometheus.CounterVec // by finished_reason, with model_name and engine
	sleepAborted  prometheus.Counter     // not vLLM's: requests a /sleep aborted
	handler       http.Handler
	modelName     string
}

// finishedReasons are the finished_reason values of
// vllm:request_success_total, vLLM's FinishReason (vllm/v1/engine), each
// series present from the start as in vLLM.
var finishedReasons = []string{"stop", "length", "abort", "error"}

// buckets125 are vLLM's buckets for token counts (build_1_2_5_buckets in
// vllm/v1/metrics/loggers.py): 1, 2, 5, 10, 20, 50… up to max.
func buckets125(max int) []float64 {
	var b []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*scale > max {
				return b
			}
			b = append(b, float64(m*scale))
		}
	}
}

// cacheConfigInfo is what vllm:cache_config_info labels: a part of
// vLLM's CacheConfig (its metrics_info), each value as Python prints it.
func cacheConfigInfo(cfg Config) prometheus.Labels {
	py := map[bool]string{true: "True", false: "False"}
	return prometheus.Labels{
		"block_size": strconv.Itoa(prefixBlock), "cache_dtype": "auto",
		"enable_prefix_caching":  py[cfg.EnablePrefixCaching],
		"gpu_memory_utilization": strconv.FormatFloat(cfg.GPUMemoryUtilization, 'g', -1, 64),
		"num_gpu_blocks":         strconv.Itoa(kvCapacity(cfg) / prefixBlock), "num_cpu_blocks": "None", "engine": "0",
	}
}

// newSimMetrics registers the metrics of the engine cfg (as NewHandler
// completes it) describes.
func newSimMetrics(cfg Config) *simMetrics {
	modelName := cfg.ServedModelNames[0]
	reg := prometheus.NewRegistry()
	labels := []string{"model_name", "engine"}
	gauge := func(name, help string) prometheus.Gauge {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName, "0")
	}
	counter := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName, "0")
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName, "0")
	}
	// vLLM's buckets: its time to first token's, its inter-token
	// latency's, and those of its request latencies (end to end, queued…).
	ttft := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itl := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	request := []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	m := &simMetrics{
		running:       gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:       gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:       gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		promptTokens:  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		ttft:          hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttft),
		itl:           hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl),
		e2e:           hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", request),
		queueTime:     hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", request),
		promptHist:    hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets125(cfg.MaxModelLen)),
		genHist:       hist("vllm:request_generation_tokens", "Number of generation tokens processed.", buckets125(cfg.MaxModelLen)),
		modelName:     modelName,
	}
	// The simulator never preempts a request: the counter stays 0.
	counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
	}, append(labels, "finished_reason"))
	reg.MustRegister(m.success)
	for _, r := range finishedReasons {
		m.success.WithLabelValues(modelName, "0", r)
	}
	info := cacheConfigInfo(cfg)
	cacheInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
	}, slices.Sorted(maps.Keys(info)))
	reg.MustRegister(cacheInfo)
	cacheInfo.With(info).Set(1)
	m.sleepState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:engine_sleep_state",
		Help: "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
	}, append(labels, "sleep_state"))
	reg.MustRegister(m.sleepState)
	m.sleepAborted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sim_sleep_aborted_requests_total", Help: "In-flight requests aborted by /sleep (simulator only).",
	})
	reg.MustRegister(m.sleepAborted)
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}

// setLoad sets the running gauge and the KV cache usage: kvTokens of
// capacity, at most 1. The caller holds Server.mu, which orders the updates.
func (m *simMetrics) setLoad(running, kvTokens, capacity int) {
	m.running.Set(float64(running))
	m.kvUsage.Set(math.Min(float64(kvTokens)/float64(capacity), 1))
}

// finished records a request that left the engine: why it finished (a
// finished_reason; "" records nothing, as for a request the dead core
// ended), its prompt and generated tokens, and its time end to end.
func (m *simMetrics) finished(reason string, prompt, generated int, e2e time.Duration) {
	if reason == "" {
		return
	}
	m.success.WithLabelValues(m.modelName, "0", reason).Inc()
	m.promptHist.Observe(float64(prompt))
	m.genHist.Observe(float64(generated))
	m.e2e.Observe(e2e.Seconds())
}

// setSleepState reports the sleep level (0 awake, 1 or 2) as vLLM does.
func (m *simMetrics) setSleepState(level int) {
	b := func(ok bool) float64 {
		if ok {
			return 1
		}
		return 0
	}
	m.sleepState.WithLabelValues(m.modelName, "0", "awake").Set(b(level == 0))
	m.sleepState.WithLabelValues(m.modelName, "0", "weights_offloaded").Set(b(level == 1))
	m.sleepState.WithLabelValues(m.modelName, "0", "discard_all").Set(b(level == 2))
}
