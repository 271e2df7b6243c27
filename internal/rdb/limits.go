package rdb

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/poold/poold/internal/tenant"
)

// gcra is the generic cell rate algorithm over one key, in one atomic step
// on the Redis server's clock (so that replicas with different clocks agree):
// the key holds the theoretical arrival time (TAT, in microseconds); a rate
// of one unit per interval T with a burst of tau worth of units. The bucket
// holds (tau - (TAT - now)) / T units: it is full at TAT <= now, in debt
// past TAT - now > tau.
//
//	KEYS[1]  the bucket
//	ARGV[1]  T, microseconds per unit
//	ARGV[2]  tau, microseconds of burst (the burst in units times T)
//	ARGV[3]  cost in units
//	ARGV[4]  mode: "take" (take cost if the bucket holds it, or, for a
//	         cost above the burst, if it is full), "check" (is the bucket
//	         not in debt), "settle" (take cost whatever, debt allowed; a
//	         negative cost gives units back, never past full)
//
// It returns {allowed, retry after µs, remaining units, reset after µs}.
var gcra = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local T = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local mode = ARGV[4]
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allowed = 1
local retry = 0
if mode == 'take' then
  local new = tat + cost * T
  if new - now > tau and tat > now then
    allowed = 0
    retry = math.max(1, math.min(new - now - tau, tat - now))
  else
    tat = new
  end
elseif mode == 'check' then
  if tat - now > tau then
    allowed = 0
    retry = tat - now - tau
  end
else
  tat = tat + cost * T
  if tat < now then tat = now end
end
if mode ~= 'check' then
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now + tau) / 1000) + 1)
end
local remaining = math.floor((tau - (tat - now)) / T)
if remaining < 0 then remaining = 0 end
return {allowed, math.floor(retry), remaining, math.floor(tat - now)}
`)

// Limits is a tenant.Limiter whose buckets live in Redis, shared by every
// fleetd replica: each check, reservation and settlement is one atomic
// script (gcra) on the server's clock, so that N replicas together admit no
// more than a tenant's limit, within one request per replica of burst.
// Each bucket's key carries the tenant's name and the limit (LimitKey). When
// Redis cannot be reached, or the client's breaker is open after calls that
// failed (ErrBreakerOpen, at once), requests are let through (OnError is
// told, for the warning and the metric), or refused with FailClosed; a
// settlement that cannot reach it is lost (OnSettleError is told). Set the
// fields before the first call.
type Limits struct {
	c *Client
	// FailClosed refuses the requests that cannot be checked.
	FailClosed bool
	// OnError, if not nil, is called for every request that could not be
	// checked (Admit), with why; OnReserveError for every reservation
	// (Reserve). They must not block.
	OnError, OnReserveError func(error)
	// OnSettleError, if not nil, is called for every Settle that could not
	// reach Redis (the tokens were neither given back nor taken), with
	// why; it must not block.
	OnSettleError func(error)
	// OnRecover, if not nil, is called when a call reaches Redis after one
	// that could not (the outage is over); it must not block.
	OnRecover func()
	// Timeout bounds each check; zero: 250 ms.
	Timeout time.Duration

	failing atomic.Bool // the last call that ended could not reach Redis
}

// Limits returns a tenant.Limiter on c.
func (c *Client) Limits() *Limits { return &Limits{c: c} }

// LimitKey is the key (after the client's prefix) of tenant's bucket for
// dim ("rpm" or "tpm") at perMinute: the limit's own setting is part of
// it, so that replicas whose tenants files give one tenant different limits
// keep a bucket each rather than spend one another's, and a reload that
// changes a limit starts from a full bucket, as in memory.
func LimitKey(dim, tenant string, perMinute int) string {
	return "limit:" + dim + ":" + strconv.Itoa(perMinute) + ":" + tenant
}

// run runs the script for one dimension of one tenant.
func (l *Limits) run(dim, tenant string, perMinute int, cost int, mode string) (allowed bool, retry time.Duration, remaining int, reset time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmpOr(l.Timeout, 250*time.Millisecond))
	defer cancel()
	period := float64(time.Minute/time.Microsecond) / float64(perMinute) // µs per unit
	burst := period * float64(perMinute)                                 // a minute's worth
	var res []int64
	err = l.c.call(func() error {
		var err error
		res, err = gcra.Run(ctx, l.c.rc, []string{l.c.prefix + LimitKey(dim, tenant, perMinute)},
			strconv.FormatFloat(period, 'f', 3, 64), strconv.FormatFloat(burst, 'f', 0, 64), cost, mode).Int64Slice()
		return err
	})
	if err != nil {
		l.failing.Store(true)
		return false, 0, 0, 0, fmt.Errorf("redis rate limit %s of %s: %w", dim, tenant, err)
	}
	if l.failing.Load() && l.failing.CompareAndSwap(true, false) && l.OnRecover != nil {
		l.OnRecover()
	}
	return res[0] == 1, time.Duration(res[1]) * time.Microsecond, int(res[2]), time.Duration(res[3]) * time.Microsecond, nil
}

// unchecked is the decision on a request that could not be checked, for
// err, after telling hook: let through, or refused with FailClosed.
func (l *Limits) unchecked(hook func(error), err error) tenant.Decision {
	if hook != nil {
		hook(err)
	}
	if l.FailClosed {
		return tenant.Decision{Limit: "unchecked", RetryAfter: time.Second}
	}
	return tenant.Decision{Allowed: true}
}

// Admit implements tenant.Limiter.
func (l *Limits) Admit(t *tenant.Tenant, now time.Time) tenant.Decision {
	var d tenant.Decision
	// Tokens first: a tenant in token debt takes no request from its bucket.
	for _, dim := range []struct {
		name, mode  string
		limit, cost int
		bucket      *tenant.Bucket
	}{
		{"tpm", "check", t.TPM, 0, &d.Tokens},
		{"rpm", "take", t.RPM, 1, &d.Requests},
	} {
		if dim.limit <= 0 {
			continue
		}
		ok, retry, left, reset, err := l.run(dim.name, t.Name, dim.limit, dim.cost, dim.mode)
		if err != nil {
			return l.unchecked(l.OnError, err)
		}
		*dim.bucket = tenant.Bucket{Limit: dim.limit, Remaining: left, Reset: reset}
		if !ok {
			d.Limit, d.RetryAfter = dim.name, retry
			return d
		}
	}
	d.Allowed = true
	return d
}

// Reserve implements tenant.Limiter.
func (l *Limits) Reserve(t *tenant.Tenant, now time.Time, tokens int) tenant.Decision {
	if t.TPM <= 0 {
		return tenant.Decision{Allowed: true}
	}
	ok, retry, left, reset, err := l.run("tpm", t.Name, t.TPM, tokens, "take")
	if err != nil {
		return l.unchecked(l.OnReserveError, err)
	}
	d := tenant.Decision{Allowed: ok, Tokens: tenant.Bucket{Limit: t.TPM, Remaining: left, Reset: reset}}
	if !ok {
		d.Limit, d.RetryAfter = "tpm", retry
	}
	return d
}

// Settle implements tenant.Limiter. A request settles in the bucket it
// was admitted to (t's limits then), whatever a reload changed since.
func (l *Limits) Settle(t *tenant.Tenant, now time.Time, reserved, used int) {
	if t.TPM <= 0 || reserved == used {
		return
	}
	if _, _, _, _, err := l.run("tpm", t.Name, t.TPM, used-reserved, "settle"); err != nil && l.OnSettleError != nil {
		l.OnSettleError(err)
	}
}
