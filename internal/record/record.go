// Package record holds what is known of one finished request: the record
// that poold's metrics, usage ledger and access log read, and the access
// log's field names, which poold's and fleetd's lines share. It depends on
// nothing of poold's, so that what reads a record links nothing else.
package record

import (
	"cmp"
	"context"
	"log/slog"
	"time"
)

// The access log's message and field names, one spelling for both daemons
// (docs/observability.md): poold writes a Request (Log), fleetd a line of
// its own with the same names for what both know.
const (
	Message = "request"

	FieldRequestID        = "request_id"
	FieldModel            = "model"
	FieldStatus           = "status"
	FieldStream           = "stream"
	FieldPromptTokens     = "prompt_tokens"
	FieldCompletionTokens = "completion_tokens"
	FieldTokensEstimated  = "tokens_estimated"
	FieldTTFBMs           = "ttfb_ms"
	FieldDurationMs       = "duration_ms"

	// poold's.
	FieldPool        = "pool"
	FieldProfile     = "profile"
	FieldClient      = "client"
	FieldOutcome     = "outcome"
	FieldQueueWaitMs = "queue_wait_ms"
	FieldTTFTMs      = "ttft_ms"
	FieldITLP50Ms    = "itl_ms_p50"
	FieldITLMaxMs    = "itl_ms_max"
	FieldKeepAliveMs = "keep_alive_ms"

	// fleetd's.
	FieldPath          = "path"
	FieldTenant        = "tenant"
	FieldHost          = "host"
	FieldReason        = "reason"
	FieldTier          = "tier"
	FieldSaturated     = "saturated"
	FieldTried         = "tried"
	FieldAborted       = "aborted"
	FieldCut           = "cut"
	FieldClientStalled = "client_stalled"
)

// Outcomes of a request (Request.Outcome): how its answer ended, whatever its
// status.
const (
	// OutcomeCompleted: the answer reached the client whole.
	OutcomeCompleted = "completed"
	// OutcomeUpstreamAborted: the engine broke the answer off (it died
	// mid-stream, or sent less than it promised); the client got an error
	// event or a cut connection.
	OutcomeUpstreamAborted = "upstream_aborted"
	// OutcomeClientAborted: the client went away before the answer ended.
	OutcomeClientAborted = "client_aborted"
	// OutcomeClientStalled: the client stopped reading, and the answer was
	// cut when it had accepted nothing for the client write timeout.
	OutcomeClientStalled = "client_stalled"
	// OutcomeShutdownCut: poold's shutdown cut the answer at the end of the
	// drain.
	OutcomeShutdownCut = "shutdown_cut"
	// OutcomeRateLimited: the tenant's limits refused the request (429).
	OutcomeRateLimited = "rate_limited"
)

// NoTenant is the client of every request when no tenants file is in force.
const NoTenant = "none"

// Request is everything known about one finished request. It feeds the
// request metrics and the usage ledger, and is the access-log line. Pool and Profile are empty when the request
// never reached a pool (bad body, unknown model).
type Request struct {
	RequestID string
	Pool      string
	Model     string // the name the client asked for
	Profile   string // the canonical profile id it resolved to
	Client    string // the tenant's name, or NoTenant (never a key)
	Status    int
	Stream    bool
	// Outcome is how the answer ended (the Outcome constants); "" means
	// OutcomeCompleted.
	Outcome string
	// Counted reports whether the engine reported usage. TokensEstimated
	// reports instead that the counts are poold's estimate, for a stream
	// that ended without usage (cut or abandoned): the chunks of generated
	// text the client received.
	Counted, TokensEstimated bool
	PromptTokens             int
	CompletionTokens         int
	QueueWait                time.Duration
	TTFB                     time.Duration
	Duration                 time.Duration
	// CausedSwap reports that the request was the one whose wait made its
	// pool swap (pool.Lease.CausedSwap), for the usage ledger.
	CausedSwap bool
	// TTFT is, for a stream, the time from arrival to the first chunk of
	// generated text sent to the client; zero when none was. ITLGaps
	// counts the gaps between such chunks, ITLP50 and ITLMax are their
	// median (estimated) and longest (see StreamTiming).
	TTFT           time.Duration
	ITLGaps        int
	ITLP50, ITLMax time.Duration
	// KeepAlive is the keep_alive the request asked, within its tenant's
	// bound (negative: as long as allowed), when HasKeepAlive.
	KeepAlive    time.Duration
	HasKeepAlive bool
}

// Log writes r as one access-log line; a stream that sent generated text
// adds its ttft_ms, and with two chunks or more its itl_ms_p50 and
// itl_ms_max.
func (r *Request) Log(log *slog.Logger) {
	var buf [18]slog.Attr
	attrs := append(buf[:0],
		slog.String(FieldRequestID, r.RequestID),
		slog.String(FieldPool, r.Pool),
		slog.String(FieldModel, r.Model),
		slog.String(FieldProfile, r.Profile),
		slog.String(FieldClient, r.Client),
		slog.Int(FieldStatus, r.Status),
		slog.Bool(FieldStream, r.Stream),
		slog.String(FieldOutcome, cmp.Or(r.Outcome, OutcomeCompleted)),
		slog.Int(FieldPromptTokens, r.PromptTokens),
		slog.Int(FieldCompletionTokens, r.CompletionTokens),
		slog.Bool(FieldTokensEstimated, r.TokensEstimated),
		slog.Int64(FieldQueueWaitMs, r.QueueWait.Milliseconds()),
		slog.Int64(FieldTTFBMs, r.TTFB.Milliseconds()),
		slog.Int64(FieldDurationMs, r.Duration.Milliseconds()),
	)
	if r.TTFT > 0 {
		attrs = append(attrs, slog.Int64(FieldTTFTMs, r.TTFT.Milliseconds()))
	}
	if r.ITLGaps > 0 {
		attrs = append(attrs, slog.Int64(FieldITLP50Ms, r.ITLP50.Milliseconds()), slog.Int64(FieldITLMaxMs, r.ITLMax.Milliseconds()))
	}
	if r.HasKeepAlive {
		// In milliseconds; -1: as long as allowed.
		ms := r.KeepAlive.Milliseconds()
		if r.KeepAlive < 0 {
			ms = -1
		}
		attrs = append(attrs, slog.Int64(FieldKeepAliveMs, ms))
	}
	log.LogAttrs(context.Background(), slog.LevelInfo, Message, attrs...)
}
