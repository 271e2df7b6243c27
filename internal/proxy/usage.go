package proxy

import (
	"errors"
	"io"
	"net/http"

	"github.com/poold/poold/internal/metrics"
)

// Usage receives each finished request's record, after the metrics and the
// access log (poold's usage ledger, package usage). Request must not block
// and must not keep rec past the call's end other than for reading: the
// handler is done with it.
type Usage interface {
	Request(rec *metrics.Record)
}

// estimatedBytesPerToken is the estimate of a prompt's tokens from its
// request body's size, for an answer without usage.
const estimatedBytesPerToken = 4

// account completes rec for the usage ledger once the exchange x is over:
// how the request ended, whether it caused a swap and, for a forwarded
// request the engine began to answer without reporting usage (a cut or
// abandoned stream), an estimate of its tokens: the request body's bytes
// over estimatedBytesPerToken, and one completion token per streamed event
// (less a chat stream's opening role-only event).
func account(rec *metrics.Record, x *exchange, r *http.Request) {
	clientGone := r.Context().Err() != nil
	var upErr error
	read := x.sse != nil || x.tail != nil
	switch {
	case x.sse != nil:
		upErr = x.sse.Err()
	case x.tail != nil:
		upErr = x.tail.Err()
	}
	ended := errors.Is(upErr, io.EOF)
	switch {
	case clientGone && !ended, rec.Status == 499:
		rec.Outcome = metrics.OutcomeAborted
	case read && !ended:
		rec.Outcome = metrics.OutcomeCut
	case rec.Status == http.StatusServiceUnavailable && x.lease == nil:
		rec.Outcome = metrics.OutcomeRejected
	case rec.Status >= 400:
		rec.Outcome = metrics.OutcomeError
	default:
		rec.Outcome = metrics.OutcomeOK
	}
	if x.lease != nil {
		rec.CausedSwap = x.lease.CausedSwap
	}
	if rec.Counted || !read || rec.Status >= 400 {
		return
	}
	rec.TokensEstimated = true
	rec.PromptTokens = len(x.body) / estimatedBytesPerToken
	if x.sse != nil {
		rec.CompletionTokens = x.sse.Events()
		if r.PathValue("path") == "chat/completions" && rec.CompletionTokens > 0 {
			rec.CompletionTokens--
		}
	}
}
