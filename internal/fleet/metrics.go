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
	scaling   *prometheus.CounterVec
	polls     *prometheus.HistogramVec
	reload    prometheus.Gauge
	// The tenants': no series without a tenants file.
	tenantRequests *prometheus.CounterVec
	tenantTokens   *prometheus.CounterVec
	unchecked      *prometheus.CounterVec
	tenantsReload  *prometheus.GaugeVec
	// Redis's breaker: no series without --redis-url.
	breakerOpen  *prometheus.GaugeVec
	breakerTrips *prometheus.CounterVec
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
		scaling: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_scale_events_total", Help: "Scale-outs and scale-ins of a model's copies by this fleetd, by direction and result: out/claimed (every awake copy was saturated; a new copy was claimed), in/unloaded (an extra copy was unloaded after its window), in/failed (the unload failed; tried again a window later), in/gone (the extra copy left by itself), in/no-token (an extra copy is no longer needed, but fleetd has no admin token to unload it).",
		}, []string{"direction", "result"}),
		polls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetd_poll_duration_seconds", Help: "Latency of one poll of a host's /status and /v1/models, by result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"host", "result"}),
		reload: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetd_hosts_file_last_reload_successful", Help: "1 when the last load of the hosts file succeeded.",
		}),
		tenantRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_tenant_requests_total", Help: "Requests of each tenant, by status code (\"cut\": the answer broke off by the host's fault); 429 counts those refused by the tenant's rate limits.",
		}, []string{"tenant", "code"}),
		tenantTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_tenant_tokens_total", Help: "Tokens debited from each tenant, by kind (prompt, completion): as the host reported them, or for a stream cut short the chunks the client got.",
		}, []string{"tenant", "kind"}),
		unchecked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetd_tenant_limits_unchecked_total", Help: "Requests whose tenant limits the shared store (Redis) could not check, by step: admit (its admission) and reserve (its worst case in tokens: the request was let through, or refused with --redis-fail-closed), settle (its unused tokens were not given back, or those used beyond its reservation not taken).",
		}, []string{"step"}),
		tenantsReload: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetd_tenants_file_last_reload_successful", Help: "1 when the last load of the tenants file succeeded; absent without one.",
		}, nil),
	}
	m.breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetd_redis_breaker_open", Help: "1 while Redis's breaker is open (calls failed in a row: claims and limit checks are not sent, the fail-open or fail-closed rule applies at once), 0 once a probe succeeded; absent without Redis.",
	}, nil)
	m.breakerTrips = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetd_redis_breaker_trips_total", Help: "Openings of Redis's breaker: after calls that failed in a row, and after each probe that failed.",
	}, nil)
	reg.MustRegister(m.requests, m.decisions, m.retries, m.hostUp, m.ejections, m.claims, m.scaling, m.polls, m.reload,
		m.tenantRequests, m.tenantTokens, m.unchecked, m.tenantsReload, m.breakerOpen, m.breakerTrips)
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

// scale counts a scale-out or scale-in (direction "out" or "in") by result.
func (m *Metrics) scale(direction, result string) {
	if m != nil {
		m.scaling.WithLabelValues(direction, result).Inc()
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
		m.hostUp.WithLabelValues(host).Set(flag(up))
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
		m.reload.Set(flag(ok))
	}
}

func (m *Metrics) tenantsReloaded(ok bool) {
	if m != nil {
		m.tenantsReload.WithLabelValues().Set(flag(ok))
	}
}

func flag(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}

// tenantRequest counts a tenant's answered request, and the tokens debited.
func (m *Metrics) tenantRequest(tenant string, status int, cut bool, prompt, completion int) {
	if m == nil {
		return
	}
	code := strconv.Itoa(status)
	if cut {
		code = "cut"
	}
	m.tenantRequests.WithLabelValues(tenant, code).Inc()
	if prompt > 0 {
		m.tenantTokens.WithLabelValues(tenant, "prompt").Add(float64(prompt))
	}
	if completion > 0 {
		m.tenantTokens.WithLabelValues(tenant, "completion").Add(float64(completion))
	}
}

// limitsUnchecked counts a request whose limits the shared store could not
// check at step (admit, reserve or settle).
func (m *Metrics) limitsUnchecked(step string) {
	if m != nil {
		m.unchecked.WithLabelValues(step).Inc()
	}
}

// RedisBreaker records a change of Redis's breaker: opened (each opening
// counted) or closed.
func (m *Metrics) RedisBreaker(open bool) {
	if m != nil {
		m.breakerOpen.WithLabelValues().Set(flag(open))
		if open {
			m.breakerTrips.WithLabelValues().Inc()
		}
	}
}

// RedisConnected gives Redis's breaker its series, closed: fleetd has a Redis.
func (m *Metrics) RedisConnected() {
	if m != nil {
		m.breakerOpen.WithLabelValues().Set(0)
		m.breakerTrips.WithLabelValues()
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

// HeaderBudgetRefused counts the client connections refused (503) because
// the headers in progress held header-bytes-budget.
func HeaderBudgetRefused(refused func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "fleetd_header_budget_refused_connections_total",
		Help: "Client connections answered 503 and closed while sending their headers: the headers in progress held header-bytes-budget.",
	}, func() float64 { return float64(refused()) })
}
