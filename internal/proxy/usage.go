package proxy

import "github.com/poold/poold/internal/metrics"

// Usage receives each finished request's record, after the metrics and the
// access log (poold's usage ledger, package usage). Request must not block
// and may keep rec only to read it: the handler is done with it.
type Usage interface {
	Request(rec *metrics.Record)
}
