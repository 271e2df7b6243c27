package usage

import "github.com/prometheus/client_golang/prometheus"

// ledgerMetrics are the ledger's collectors.
type ledgerMetrics struct {
	written, dropped [2]prometheus.Counter
	errors           prometheus.Counter
}

func newLedgerMetrics(reg prometheus.Registerer, l *Ledger) *ledgerMetrics {
	written := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poold_usage_records_written_total", Help: "Usage ledger records committed to the local database, by kind (request: a request's row; activity: a pool's activity change).",
	}, []string{"kind"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poold_usage_records_dropped_total", Help: "Usage ledger records lost, by kind (request, activity): the writer's queue was full, or the database did not take them and the spool was full.",
	}, []string{"kind"})
	m := &ledgerMetrics{errors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "poold_usage_write_errors_total", Help: "Usage ledger transactions that failed.",
	})}
	for k, name := range kindNames {
		m.written[k], m.dropped[k] = written.WithLabelValues(name), dropped.WithLabelValues(name)
	}
	if reg != nil {
		reg.MustRegister(written, dropped, m.errors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "poold_usage_queue_records", Help: "Usage ledger records waiting for the writer.",
		}, func() float64 {
			l.mu.Lock()
			defer l.mu.Unlock()
			return float64(len(l.queue))
		}), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "poold_usage_spooled_records", Help: "Usage ledger rows the database did not take yet, waiting in the spool (in memory and in its file).",
		}, func() float64 {
			l.mu.Lock()
			defer l.mu.Unlock()
			return float64(l.spooled)
		}))
	}
	return m
}
