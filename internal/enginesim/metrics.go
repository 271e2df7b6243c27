package enginesim

import (
	"math"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// simMetrics holds vLLM's metrics for one simulated engine, in a private
// registry, with vLLM's names, types and labels: every vllm:* series has
// model_name (the first served name) and engine ("0"). All members are safe
// for concurrent use.
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
	sleepAborted  prometheus.Counter // not vLLM's: requests a /sleep aborted
	handler       http.Handler
	modelName     string
}

func newSimMetrics(modelName string) *simMetrics {
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
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	m := &simMetrics{
		running:       gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:       gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:       gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		promptTokens:  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		ttft:          hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", latency),
		itl:           hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", latency),
		e2e:           hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latency),
		modelName:     modelName,
	}
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
