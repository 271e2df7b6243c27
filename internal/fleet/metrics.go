package fleet

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are fleetd's Prometheus collectors. A nil *Metrics records nothing.
type Metrics struct {
	requests  *prometheus.CounterVec
	decisions *prometheus.CounterVec
	retries   *prometheus.CounterVec
	hostUp    *prometheus.GaugeVec
	ejections *prometheus.CounterVec
	claims    *prometheus.CounterVec
	polls     *prometheus.HistogramVec
	reload    prometheus.Gauge
}

// NewMetrics registers fleetd's collectors with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_requests_total", Help: "Requests answered, by the host that answered (\"none\" when no host did), model and status class (\"cut\": the answer broke off by the host's fault).",
		}, []string{"host", "model", "code_class"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_routing_decisions_total", Help: "Routing decisions by reason: awake, loading, asleep, idle, queue or scale-out.",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_retries_total", Help: "Requests retried on the next host, by the host that failed and the cause (connect, silent, key, full or refused).",
		}, []string{"host", "cause"}),
		hostUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetd_host_up", Help: "1 when the host is polled and not ejected, else 0.",
		}, []string{"host"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_host_ejections_total", Help: "Ejections from routing, by host and cause: poll, silent or connect (the host), errors (one model on the host).",
		}, []string{"host", "cause"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_copy_claims_total", Help: "Claims of a model's new copy (cold load or scale-out), by result: won, followed (another request or replica had claimed it), lost-unroutable, error (the shared store failed).",
		}, []string{"result"}),
		polls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetd_poll_duration_seconds", Help: "Latency of one poll of a host's /status and /v1/models, by result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"host", "result"}),
		reload: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetd_hosts_file_last_reload_successful", Help: "1 when the last load of the hosts file succeeded.",
		}),
	}
	reg.MustRegister(m.requests, m.decisions, m.retries, m.hostUp, m.ejections, m.claims, m.polls, m.reload)
	return m
}

// request counts an answered request; cut says it broke off by the host's
// fault, which is its own class whatever the status.
func (m *Metrics) request(host, model string, status int, cut bool) {
	if m != nil {
		class := strconv.Itoa(status/100) + "xx"
		if cut {
			class = "cut"
		}
		m.requests.WithLabelValues(host, model, class).Inc()
	}
}

func (m *Metrics) claim(result string) {
	if m != nil {
		m.claims.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) decision(reason string) {
	if m != nil {
		m.decisions.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) retry(host, cause string) {
	if m != nil {
		m.retries.WithLabelValues(host, cause).Inc()
	}
}

func (m *Metrics) setUp(host string, up bool) {
	if m != nil {
		v := 0.0
		if up {
			v = 1
		}
		m.hostUp.WithLabelValues(host).Set(v)
	}
}

func (m *Metrics) eject(host, cause string) {
	if m != nil {
		m.ejections.WithLabelValues(host, cause).Inc()
	}
}

func (m *Metrics) poll(host string, took time.Duration, ok bool) {
	if m != nil {
		result := "ok"
		if !ok {
			result = "error"
		}
		m.polls.WithLabelValues(host, result).Observe(took.Seconds())
	}
}

func (m *Metrics) reloaded(ok bool) {
	if m != nil {
		v := 0.0
		if ok {
			v = 1
		}
		m.reload.Set(v)
	}
}

// forget drops the series of a host that left the fleet.
func (m *Metrics) forget(host string) {
	if m != nil {
		l := prometheus.Labels{"host": host}
		m.hostUp.DeletePartialMatch(l)
		m.ejections.DeletePartialMatch(l)
		m.polls.DeletePartialMatch(l)
		m.retries.DeletePartialMatch(l)
		m.requests.DeletePartialMatch(l)
	}
}
