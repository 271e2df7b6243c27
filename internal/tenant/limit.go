package tenant

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Decision is a limiter's answer to one request of a tenant.
type Decision struct {
	// Allowed is false when a limit refuses the request: Limit names it
	// ("rpm" or "tpm") and RetryAfter says when it would allow it.
	Allowed    bool
	Limit      string
	RetryAfter time.Duration
	// Requests and Tokens are the state of the tenant's two buckets, for
	// OpenAI's x-ratelimit-* headers; a zero Bucket is a dimension without
	// a limit.
	Requests, Tokens Bucket
}

// Bucket is the state of one of a tenant's buckets at a decision.
type Bucket struct {
	// Limit is the bucket's size, its limit per minute; zero: no limit.
	Limit int
	// Remaining is what it holds (never below zero); Reset is how long it
	// takes to be full again.
	Remaining int
	Reset     time.Duration
}

// A Limiter admits a tenant's requests within its limits and is told the
// tokens each one used. Local buckets (Limits) hold for one daemon; a
// shared store holds across the replicas of a fleet.
type Limiter interface {
	// Admit decides whether t may send a request now: its request bucket
	// has a request left and its token bucket is not in debt. An admitted
	// request is counted.
	Admit(t *Tenant, now time.Time) Decision
	// Debit takes the tokens a request used (prompt and completion, or
	// their estimate) from t's token bucket, which may go into debt.
	Debit(t *Tenant, now time.Time, tokens int)
}

// Limits is a Limiter with in-memory token buckets (golang.org/x/time/rate):
// per tenant, one of RPM requests and one of TPM tokens, each refilled
// evenly over a minute and holding at most a minute's worth. The zero value
// is ready; it is safe for concurrent use.
type Limits struct {
	mu      sync.Mutex // guards buckets
	buckets map[string]*buckets
}

// buckets are one tenant's: nil where it has no limit. rpm and tpm are the
// limits they were made for, so that a reload keeps them only if unchanged.
type buckets struct {
	rpm, tpm int
	req, tok *rate.Limiter
}

func newBuckets(t *Tenant) *buckets {
	b := &buckets{rpm: t.RPM, tpm: t.TPM}
	if t.RPM > 0 {
		b.req = rate.NewLimiter(rate.Limit(float64(t.RPM)/60), t.RPM)
	}
	if t.TPM > 0 {
		b.tok = rate.NewLimiter(rate.Limit(float64(t.TPM)/60), t.TPM)
	}
	return b
}

// Apply keeps the buckets of the tenants of c whose limits did not change,
// makes new ones for the others, and forgets tenants that c lacks: a
// tenants file reload changes limits without resetting everyone's.
func (l *Limits) Apply(c *Config) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make(map[string]*buckets, len(c.Tenants))
	for _, t := range c.Tenants {
		if b := l.buckets[t.Name]; b != nil && b.rpm == t.RPM && b.tpm == t.TPM {
			next[t.Name] = b
			continue
		}
		next[t.Name] = newBuckets(t)
	}
	l.buckets = next
}

func (l *Limits) of(t *Tenant) *buckets {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[t.Name]
	if b == nil || b.rpm != t.RPM || b.tpm != t.TPM {
		if l.buckets == nil {
			l.buckets = make(map[string]*buckets)
		}
		b = newBuckets(t)
		l.buckets[t.Name] = b
	}
	return b
}

// Admit implements Limiter.
func (l *Limits) Admit(t *Tenant, now time.Time) Decision {
	b := l.of(t)
	if b.tok != nil {
		if left := b.tok.TokensAt(now); left < 0 {
			// In debt: allowed again once it is paid back.
			d := b.state(now)
			d.Limit, d.RetryAfter = "tpm", refill(-left, b.tok.Limit())
			return d
		}
	}
	if b.req != nil {
		r := b.req.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			dec := b.state(now)
			dec.Limit, dec.RetryAfter = "rpm", d
			return dec
		}
	}
	d := b.state(now)
	d.Allowed = true
	return d
}

// Debit implements Limiter.
func (l *Limits) Debit(t *Tenant, now time.Time, tokens int) {
	b := l.of(t)
	if b.tok == nil {
		return
	}
	// A reservation may not exceed the burst: take a large count in parts,
	// each of which may leave the bucket in debt.
	for tokens > 0 {
		n := min(tokens, b.tok.Burst())
		b.tok.ReserveN(now, n)
		tokens -= n
	}
}

// state is the Decision of b at now, but for its verdict.
func (b *buckets) state(now time.Time) Decision {
	return Decision{Requests: bucketAt(b.req, now), Tokens: bucketAt(b.tok, now)}
}

// bucketAt is lim's state at now; a nil lim is no limit.
func bucketAt(lim *rate.Limiter, now time.Time) Bucket {
	if lim == nil {
		return Bucket{}
	}
	left := lim.TokensAt(now)
	return Bucket{Limit: lim.Burst(), Remaining: int(math.Max(0, math.Floor(left))), Reset: refill(float64(lim.Burst())-left, lim.Limit())}
}

// refill is how long r takes to put n tokens back.
func refill(n float64, r rate.Limit) time.Duration {
	if n <= 0 || r <= 0 {
		return 0
	}
	return time.Duration(n / float64(r) * float64(time.Second))
}

// ResetString writes a reset time as OpenAI does: "1s", "6m0s", "20ms".
func ResetString(d time.Duration) string {
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}
