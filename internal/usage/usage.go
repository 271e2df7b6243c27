// Package usage is poold's usage ledger: one row per finished request and
// one per stretch of a pool's time in one activity (serving, idle,
// swapping, asleep, empty), kept in an SQLite database in the state
// directory, optionally shipped to PostgreSQL for the whole fleet, and the
// reports read from either: usage and cost per tenant, model, pool or day,
// with the GPU time nobody used on lines of its own (docs/usage.md).
//
// The attribution of GPU time and its cost (report.go) is pure: it reads
// rows and returns lines, with no clock and no I/O. Storage, the writer and
// the shipper are the rest.
package usage

import (
	"time"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/record"
)

// Request is one finished request's row.
type Request struct {
	// Host is the poold that served it; empty for rows read from the
	// local ledger. Seq is the row's key in its ledger, in write order.
	Host string
	Seq  int64
	// RequestID is the access log's request_id: the client's X-Request-Id
	// when it sent one, so it need not be unique.
	RequestID                    string
	Arrived, Ended               time.Time
	Tenant, Model, Profile, Pool string
	Status                       int
	Outcome                      string
	Stream                       bool
	PromptTokens                 int64
	CompletionTokens             int64
	TokensEstimated              bool
	QueueWait, TTFT, Duration    time.Duration
	CausedSwap                   bool
}

// Failed reports whether the request did not get a whole, successful
// answer: a status of 400 or more, or an answer cut off.
func (r *Request) Failed() bool {
	return r.Status >= 400 || r.Outcome != record.OutcomeCompleted
}

// leaseStart is when the request's lease began, as far as its row tells.
func (r *Request) leaseStart() time.Time { return r.Arrived.Add(r.QueueWait) }

// Interval is one stretch of a pool's time in one activity, [Start, End).
type Interval struct {
	Host     string // as Request.Host
	Seq      int64
	Pool     string
	Activity activity.Activity
	// Profile is the profile serving, idle or being loaded; while asleep,
	// the sleeping profiles joined by ",".
	Profile  string
	GPUs     []int
	GPUModel string // the pool's GPUs' model name; empty without NVML
	Start    time.Time
	End      time.Time
	// Open marks the interval still going: End is the writer's last
	// checkpoint (at most a second old while poold runs).
	Open bool
}

// gpuCount is the number of GPUs the interval held.
func (iv *Interval) gpuCount() int64 { return int64(len(iv.GPUs)) }
