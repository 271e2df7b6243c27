package tenant

import (
	"math"
	"strconv"
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
	// Headers are OpenAI's x-ratelimit-* headers for the answer: the limit,
	// what remains and when the bucket is full again, for each dimension
	// the tenant has a limit on.
	Headers [][2]string
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
			return Decision{Limit: "tpm", RetryAfter: refill(-left, b.tok.Limit()), Headers: b.headers(now)}
		}
	}
	if b.req != nil {
		r := b.req.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			return Decision{Limit: "rpm", RetryAfter: d, Headers: b.headers(now)}
		}
	}
	return Decision{Allowed: true, Headers: b.headers(now)}
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

// headers are the x-ratelimit-* headers of b at now.
func (b *buckets) headers(now time.Time) [][2]string {
	var h [][2]string
	add := func(dim string, lim *rate.Limiter) {
		left := lim.TokensAt(now)
		h = append(h,
			[2]string{"x-ratelimit-limit-" + dim, strconv.Itoa(lim.Burst())},
			[2]string{"x-ratelimit-remaining-" + dim, strconv.Itoa(int(math.Max(0, math.Floor(left))))},
			[2]string{"x-ratelimit-reset-" + dim, ResetString(refill(float64(lim.Burst())-left, lim.Limit()))},
		)
	}
	if b.req != nil {
		add("requests", b.req)
	}
	if b.tok != nil {
		add("tokens", b.tok)
	}
	return h
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
