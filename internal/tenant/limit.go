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

// A Limiter admits a tenant's requests within its limits. A request is
// checked twice: Admit before its body is read, and Reserve once its worst
// case in tokens is known; when it ends, Settle puts its tokens right.
// Local buckets (Limits) hold for one daemon; a shared store holds across
// the replicas of a fleet.
type Limiter interface {
	// Admit decides whether t may send a request now: its request bucket
	// has a request left and its token bucket is not in debt. An admitted
	// request is counted.
	Admit(t *Tenant, now time.Time) Decision
	// Reserve takes a request's worst case, tokens, from t's token bucket,
	// and refuses the request (Limit "tpm") when the bucket does not hold
	// it. A worst case above the whole limit is taken only from a full
	// bucket, which it puts in debt: a large request waits for a full
	// bucket rather than being refused forever.
	Reserve(t *Tenant, now time.Time, tokens int) Decision
	// Settle puts right a request's reservation once it ends: the tokens
	// reserved but not used go back to t's token bucket (never filling it
	// past its size), and those used beyond the reservation are taken,
	// which may put it in debt. A request reserved nothing (0) when it
	// ended before Reserve.
	Settle(t *Tenant, now time.Time, reserved, used int)
}

// Limits is a Limiter with in-memory buckets, per tenant: one of RPM
// requests (golang.org/x/time/rate) and one of TPM tokens (tokenBucket),
// each refilled evenly over a minute and holding at most a minute's worth.
// The zero value is ready; it is safe for concurrent use.
type Limits struct {
	mu      sync.Mutex // guards buckets
	buckets map[string]*buckets
}

// buckets are one tenant's: nil where it has no limit. rpm and tpm are the
// limits they were made for, so that a reload keeps them only if unchanged.
type buckets struct {
	rpm, tpm int
	req      *rate.Limiter
	tok      *tokenBucket
}

func newBuckets(t *Tenant) *buckets {
	b := &buckets{rpm: t.RPM, tpm: t.TPM}
	if t.RPM > 0 {
		b.req = rate.NewLimiter(rate.Limit(float64(t.RPM)/60), t.RPM)
	}
	if t.TPM > 0 {
		b.tok = &tokenBucket{size: t.TPM, level: float64(t.TPM)}
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

// of is t's buckets, made anew when t's limits are not theirs.
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
		if debt := b.tok.debt(now); debt > 0 {
			// Allowed again once it is paid back.
			d := b.state(now)
			d.Limit, d.RetryAfter = "tpm", refill(debt, b.tok.rate())
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

// Reserve implements Limiter.
func (l *Limits) Reserve(t *Tenant, now time.Time, tokens int) Decision {
	b := l.of(t)
	if b.tok == nil {
		return Decision{Allowed: true, Requests: bucketAt(b.req, now)}
	}
	wait := b.tok.take(now, tokens)
	d := b.state(now)
	if wait > 0 {
		d.Limit, d.RetryAfter = "tpm", wait
		return d
	}
	d.Allowed = true
	return d
}

// Settle implements Limiter. A request admitted before a reload settles
// with the bucket in force for its tenant's name, whatever its limits, so
// that a reload is not undone by the requests it finds in flight; one of a
// tenant that the reload removed settles with nothing.
func (l *Limits) Settle(t *Tenant, now time.Time, reserved, used int) {
	l.mu.Lock()
	b := l.buckets[t.Name]
	l.mu.Unlock()
	if b == nil || b.tok == nil {
		return
	}
	b.tok.put(now, reserved-used)
}

// state is the Decision of b at now, but for its verdict.
func (b *buckets) state(now time.Time) Decision {
	return Decision{Requests: bucketAt(b.req, now), Tokens: b.tok.bucket(now)}
}

// bucketAt is lim's state at now; a nil lim is no limit.
func bucketAt(lim *rate.Limiter, now time.Time) Bucket {
	if lim == nil {
		return Bucket{}
	}
	left := lim.TokensAt(now)
	return Bucket{Limit: lim.Burst(), Remaining: int(math.Max(0, math.Floor(left))), Reset: refill(float64(lim.Burst())-left, lim.Limit())}
}

// tokenBucket is a tenant's bucket of tokens per minute, which its requests
// take their worst case from and give back what they did not use: unlike
// rate.Limiter, whose tokens cannot be put back once an event acted on
// them, it can be refunded. It refills by size every minute and holds at
// most size; its level goes below zero (debt) only by a worst case above
// size or tokens used beyond a reservation.
type tokenBucket struct {
	size int // tokens per minute, and the most the bucket holds

	mu    sync.Mutex // guards level and at
	level float64    // tokens held at at; negative: debt
	at    time.Time  // when level was last brought up to date; zero: never
}

// rate is the bucket's refill rate, in tokens a second.
func (b *tokenBucket) rate() rate.Limit { return rate.Limit(float64(b.size) / 60) }

// advance refills the bucket up to now; a now before the last one refills
// nothing. It requires b.mu.
func (b *tokenBucket) advance(now time.Time) {
	if !now.After(b.at) {
		return
	}
	if !b.at.IsZero() {
		b.level = math.Min(float64(b.size), b.level+now.Sub(b.at).Seconds()*float64(b.rate()))
	}
	b.at = now
}

// debt is what the bucket owes at now; zero when it is not in debt.
func (b *tokenBucket) debt(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return math.Max(0, -b.level)
}

// take takes n tokens at now when the bucket holds them, or when n is more
// than size and the bucket is full; otherwise it takes nothing and returns
// how long until it would take them (until the bucket is full, for more
// than size).
func (b *tokenBucket) take(now time.Time, n int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	need := float64(n)
	if n > b.size {
		need = float64(b.size)
	}
	if b.level < need {
		return max(refill(need-b.level, b.rate()), time.Millisecond)
	}
	b.level -= float64(n)
	return 0
}

// put adds n tokens at now (n negative: takes them), never filling the
// bucket past its size.
func (b *tokenBucket) put(now time.Time, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	b.level = math.Min(float64(b.size), b.level+float64(n))
}

// bucket is b's state at now; a nil b is no limit.
func (b *tokenBucket) bucket(now time.Time) Bucket {
	if b == nil {
		return Bucket{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return Bucket{Limit: b.size, Remaining: int(math.Max(0, math.Floor(b.level))), Reset: refill(float64(b.size)-b.level, b.rate())}
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
