package metrics

import "github.com/prometheus/client_golang/prometheus"

// EngineConnsClosed exports closed, the count of idle connections that an
// engine closed before poold did, read at scrape time.
func EngineConnsClosed(closed func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "poold_engine_connections_closed_by_engine_total",
		Help: "Idle keep-alive connections to engines that the engine closed before poold did; above zero, an engine's keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) is shorter than poold assumes.",
	}, func() float64 { return float64(closed()) })
}

// HeaderBudgetRefused counts the client connections refused (503) because
// the headers in progress on the host held header-bytes-budget.
func HeaderBudgetRefused(refused func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "poold_header_budget_refused_connections_total",
		Help: "Client connections answered 503 and closed while sending their headers: the headers in progress on the host held header-bytes-budget.",
	}, func() float64 { return float64(refused()) })
}
