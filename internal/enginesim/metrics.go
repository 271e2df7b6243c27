package enginesim

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// kvCapacity is the number of concurrent requests that fill the simulated KV cache
// (vLLM's default max_num_seqs).
const kvCapacity = 256

// simMetrics holds vLLM's metrics for one simulated engine, in a private registry.
// All members are safe for concurrent use.
type simMetrics struct {
	running      prometheus.Gauge
	waiting      prometheus.Gauge
	kvUsage      prometheus.Gauge
	promptTokens prometheus.Counter
	genTokens    prometheus.Counter
	ttft         prometheus.Observer
	itl          prometheus.Observer
	e2e          prometheus.Observer
	sleepAborted prometheus.Counter // not vLLM's: requests a /sleep aborted
	handler      http.Handler
}

func newSimMetrics(modelName string) *simMetrics {
	reg := prometheus.NewRegistry()
	labels := []string{"model_name"}
	gauge := func(name, help string) prometheus.Gauge {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName)
	}
	counter := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName)
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(v)
		return v.WithLabelValues(modelName)
	}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	m := &simMetrics{
		running:      gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:      gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:      gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		promptTokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:    counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		ttft:         hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", latency),
		itl:          hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", latency),
		e2e:          hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latency),
	}
	m.sleepAborted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sim_sleep_aborted_requests_total", Help: "In-flight requests aborted by /sleep (simulator only).",
	})
	reg.MustRegister(m.sleepAborted)
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return m
}
