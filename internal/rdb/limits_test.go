package rdb_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb"
	"github.com/poold/poold/internal/rdb/rdbtest"
	"github.com/poold/poold/internal/tenant"
)

// limits is a Limits on its own client, with a timeout that a busy test
// machine does not reach (a check that times out is let through).
func limits(t *testing.T, url string) *rdb.Limits {
	t.Helper()
	l := open(t, url).Limits()
	l.Timeout = 10 * time.Second
	return l
}

func open(t *testing.T, url string) *rdb.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A short breaker backoff: a test that stops Redis sees it back soon.
	c, err := rdb.Open(ctx, url, rdb.Options{Prefix: "test:", BreakerBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Two replicas sharing a Redis together admit a tenant's requests per
// minute, not each: of 100 concurrent requests at 60 a minute, 60 pass
// (61 if a second elapses and one more unit refills).
func TestLimitsAcrossReplicas(t *testing.T) {
	url := rdbtest.Start(t)
	replicas := []*rdb.Limits{limits(t, url), limits(t, url)}
	ten := &tenant.Tenant{Name: "team-a", RPM: 60}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			d := replicas[i%2].Admit(ten, time.Now())
			if d.Allowed {
				admitted.Add(1)
				return
			}
			if d.Limit != "rpm" || d.RetryAfter <= 0 {
				t.Errorf("refused with limit %q retry %v", d.Limit, d.RetryAfter)
			}
			refused.Add(1)
		})
	}
	wg.Wait()
	if n := admitted.Load(); n < 60 || n > 61 {
		t.Fatalf("admitted %d of 100 at 60 rpm across two replicas, want 60 (or 61)", n)
	}
	t.Logf("admitted %d, refused %d", admitted.Load(), refused.Load())
	d := replicas[0].Admit(ten, time.Now())
	if d.Allowed || d.Requests.Limit != 60 || d.Requests.Remaining != 0 || d.Requests.Reset <= 0 || d.Tokens != (tenant.Bucket{}) {
		t.Fatalf("a request over the limit: %+v", d)
	}
}

// A request's worst case is reserved from the shared token bucket, and
// refused when the bucket does not hold it; what it did not use comes back
// (never past full), what it used beyond is taken and may put the bucket
// in debt, where Admit refuses on tpm until it is paid back. Counts allow a
// token or two of refill while the test runs (1,000 a minute: one per 60 ms).
func TestLimitsTokenReservations(t *testing.T) {
	l := limits(t, rdbtest.Start(t))
	ten := &tenant.Tenant{Name: "team-b", TPM: 1000}
	near := func(got, want int) bool { return got >= want && got <= want+2 }
	d := l.Admit(ten, time.Now())
	if !d.Allowed || d.Tokens != (tenant.Bucket{Limit: 1000, Remaining: 1000}) || d.Requests != (tenant.Bucket{}) {
		t.Fatalf("a fresh tenant: %+v", d)
	}
	if d := l.Reserve(ten, time.Now(), 600); !d.Allowed || !near(d.Tokens.Remaining, 400) {
		t.Fatalf("600 of 1,000: %+v", d)
	}
	d = l.Reserve(ten, time.Now(), 500)
	if d.Allowed || d.Limit != "tpm" || !near(d.Tokens.Remaining, 400) {
		t.Fatalf("500 more of 400: %+v", d)
	}
	// 100 missing at 1,000 a minute: 6 s.
	if d.RetryAfter < 5500*time.Millisecond || d.RetryAfter > 6*time.Second {
		t.Fatalf("retry after %v, want about 6 s", d.RetryAfter)
	}
	if d := l.Admit(ten, time.Now()); !d.Allowed {
		t.Fatalf("a bucket not in debt refused at admission: %+v", d)
	}

	l.Settle(ten, time.Now(), 600, 100) // 500 back: 900
	if d := l.Reserve(ten, time.Now(), 500); !d.Allowed || !near(d.Tokens.Remaining, 400) {
		t.Fatalf("after a refund of 500: %+v", d)
	}
	for range 3 {
		l.Settle(ten, time.Now(), 500, 0) // never past full
	}
	if d := l.Reserve(ten, time.Now(), 0); !d.Allowed || d.Tokens.Remaining != 1000 {
		t.Fatalf("refunds past full: %+v", d)
	}

	// Above the limit: only from a full bucket, which it puts in debt.
	if d := l.Reserve(ten, time.Now(), 1500); !d.Allowed {
		t.Fatalf("1,500 of a full bucket of 1,000: %+v", d)
	}
	if d := l.Reserve(ten, time.Now(), 1500); d.Allowed || d.Limit != "tpm" || d.RetryAfter < 89*time.Second {
		t.Fatalf("1,500 again, of a bucket 500 in debt: %+v, want refused until full (90 s)", d)
	}
	l.Settle(ten, time.Now(), 1500, 1900) // 400 more: 900 in debt
	d = l.Admit(ten, time.Now())
	if d.Allowed || d.Limit != "tpm" || d.Tokens.Remaining != 0 {
		t.Fatalf("a tenant 900 in debt was admitted: %+v", d)
	}
	// 900 tokens at 1000 a minute take 54 s to pay back.
	if d.RetryAfter < 50*time.Second || d.RetryAfter > 55*time.Second {
		t.Fatalf("retry after %v, want about 54s", d.RetryAfter)
	}
}

// Two replicas sharing a Redis reserve from one token bucket: of 100
// concurrent worst cases of 100 at 1,000 a minute, 10 are reserved (an
// 11th would need 6 s of refill).
func TestLimitsReservationsAcrossReplicas(t *testing.T) {
	url := rdbtest.Start(t)
	replicas := []*rdb.Limits{limits(t, url), limits(t, url)}
	ten := &tenant.Tenant{Name: "team-s", TPM: 1000}
	var reserved atomic.Int64
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			d := replicas[i%2].Reserve(ten, time.Now(), 100)
			if d.Allowed {
				reserved.Add(1)
			} else if d.Limit != "tpm" || d.RetryAfter <= 0 {
				t.Errorf("refused with limit %q retry %v", d.Limit, d.RetryAfter)
			}
		})
	}
	wg.Wait()
	if n := reserved.Load(); n != 10 {
		t.Fatalf("%d of 100 worst cases of 100 reserved at 1,000 tpm across two replicas, want 10", n)
	}
}

// A reload that changes a tenant's limit starts from a full bucket of the
// new limit (its key carries the limit), as in memory; what was reserved
// under the old one settles there.
func TestLimitsReload(t *testing.T) {
	l := limits(t, rdbtest.Start(t))
	old, next := &tenant.Tenant{Name: "team-r", TPM: 1000}, &tenant.Tenant{Name: "team-r", TPM: 2000}
	if d := l.Reserve(old, time.Now(), 800); !d.Allowed {
		t.Fatalf("800 of 1,000: %+v", d)
	}
	if d := l.Reserve(next, time.Now(), 2000); !d.Allowed || d.Tokens.Limit != 2000 {
		t.Fatalf("the whole new limit: %+v", d)
	}
	l.Settle(old, time.Now(), 800, 0) // back to the old bucket: full
	if d := l.Reserve(old, time.Now(), 1000); !d.Allowed {
		t.Fatalf("the old bucket after the refund: %+v", d)
	}
}

// Two replicas whose tenants files give one tenant different limits (rpm
// 60 and 600) keep a bucket each: the replica at 600 admits its 600 (to
// 610 while they arrive) whatever the one at 60 spent first, and the one
// at 60 its 60.
func TestLimitsDifferentFiles(t *testing.T) {
	url := rdbtest.Start(t)
	slow, fast := limits(t, url), limits(t, url)
	low, high := &tenant.Tenant{Name: "team-x", RPM: 60}, &tenant.Tenant{Name: "team-x", RPM: 600}
	admit := func(l *rdb.Limits, ten *tenant.Tenant, n int) int {
		var ok atomic.Int64
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if l.Admit(ten, time.Now()).Allowed {
					ok.Add(1)
				}
			})
		}
		wg.Wait()
		return int(ok.Load())
	}
	if n := admit(slow, low, 100); n < 60 || n > 62 {
		t.Fatalf("the replica at 60 rpm admitted %d of 100", n)
	}
	if n := admit(fast, high, 700); n < 600 || n > 610 {
		t.Fatalf("the replica at 600 rpm admitted %d of 700 after the one at 60 spent its bucket, want its 600", n)
	}
	if d := slow.Admit(low, time.Now()); d.Allowed || d.Requests.Limit != 60 {
		t.Fatalf("the replica at 60 after the one at 600: %+v", d)
	}
}

// A stalled Redis (SIGSTOP) trips the client's breaker: after three checks
// that time out, the next ones fail at once (ErrBreakerOpen) without asking,
// the fail-open rule applied; the breaker is told each change, and once Redis
// goes on (SIGCONT), the first probe after the backoff closes it.
func TestLimitsBreaker(t *testing.T) {
	srv := rdbtest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex // guards states
	var states []rdb.BreakerState
	c, err := rdb.Open(ctx, srv.URL, rdb.Options{Prefix: "test:", BreakerBackoff: 500 * time.Millisecond,
		OnBreaker: func(s rdb.BreakerState, _ time.Duration) { mu.Lock(); states = append(states, s); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const timeout = 200 * time.Millisecond
	l := c.Limits()
	l.Timeout = timeout
	var errs []error
	l.OnError = func(err error) { errs = append(errs, err) }
	ten := &tenant.Tenant{Name: "team-z", RPM: 6000}
	if d := l.Admit(ten, time.Now()); !d.Allowed || len(errs) != 0 {
		t.Fatalf("with Redis: %+v %v", d, errs)
	}
	srv.Pause()
	slow := 0
	for i := range 20 {
		start := time.Now()
		if d := l.Admit(ten, time.Now()); !d.Allowed {
			t.Fatalf("fail-open refused: %+v", d)
		}
		if time.Since(start) >= timeout {
			slow++
			if i >= 3 {
				t.Fatalf("check %d waited out the timeout: the breaker did not open after 3", i)
			}
		}
	}
	if slow != 3 || len(errs) != 20 || !errors.Is(errs[19], rdb.ErrBreakerOpen) {
		t.Fatalf("%d checks waited out the timeout (want 3); %d unchecked, the last: %v", slow, len(errs), errs[len(errs)-1])
	}
	srv.Resume()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := len(errs)
		l.Admit(ten, time.Now())
		if len(errs) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still unchecked 10s after Redis went on: %v", errs[len(errs)-1])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(states) < 2 || states[0] != rdb.BreakerOpen || states[len(states)-1] != rdb.BreakerClosed {
		t.Fatalf("breaker changes %v, want open … closed", states)
	}
}

// A Redis that cannot be reached lets requests through, telling OnError
// (OnReserveError for a reservation, OnSettleError for a settlement),
// unless FailClosed, which refuses them; the
// first call that reaches it again calls OnRecover, once.
func TestLimitsWithoutRedis(t *testing.T) {
	srv := rdbtest.Run(t)
	l := limits(t, srv.URL)
	var errs, reserveErrs, settleErrs, recovered atomic.Int64
	l.OnError = func(err error) {
		if err == nil {
			t.Error("OnError(nil)")
		}
		errs.Add(1)
	}
	l.OnReserveError = func(error) { reserveErrs.Add(1) }
	l.OnSettleError = func(error) { settleErrs.Add(1) }
	l.OnRecover = func() { recovered.Add(1) }
	ten := &tenant.Tenant{Name: "team-c", RPM: 1, TPM: 10}
	if d := l.Admit(ten, time.Now()); !d.Allowed || recovered.Load() != 0 {
		t.Fatalf("with Redis: %+v, recovered %d", d, recovered.Load())
	}
	srv.Stop()
	if d := l.Admit(ten, time.Now()); !d.Allowed {
		t.Fatalf("fail-open refused: %+v", d)
	}
	if d := l.Reserve(ten, time.Now(), 100); !d.Allowed {
		t.Fatalf("fail-open refused a reservation: %+v", d)
	}
	l.Settle(ten, time.Now(), 100, 5)
	if errs.Load() != 1 || reserveErrs.Load() != 1 || settleErrs.Load() != 1 {
		t.Fatalf("OnError called %d times, OnReserveError %d and OnSettleError %d, want 1 each", errs.Load(), reserveErrs.Load(), settleErrs.Load())
	}
	l.FailClosed = true
	if d := l.Admit(ten, time.Now()); d.Allowed || d.Limit != "unchecked" || d.RetryAfter <= 0 {
		t.Fatalf("fail-closed admitted: %+v", d)
	}
	if d := l.Reserve(ten, time.Now(), 1); d.Allowed || d.Limit != "unchecked" || d.RetryAfter <= 0 {
		t.Fatalf("fail-closed reserved: %+v", d)
	}
	if recovered.Load() != 0 {
		t.Fatal("OnRecover called while Redis is down")
	}
	srv.Start() // empty: the bucket is full again
	for deadline := time.Now().Add(10 * time.Second); !l.Admit(&tenant.Tenant{Name: "team-d", RPM: 5}, time.Now()).Allowed; {
		if time.Now().After(deadline) {
			t.Fatal("Redis restarted, but requests are still refused unchecked after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Admit(&tenant.Tenant{Name: "team-d", RPM: 5}, time.Now())
	if recovered.Load() != 1 {
		t.Fatalf("OnRecover called %d times, want 1", recovered.Load())
	}
	var _ tenant.Limiter = l
}
