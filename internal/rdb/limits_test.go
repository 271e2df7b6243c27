package rdb_test

import (
	"context"
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
	c, err := rdb.Open(ctx, url, rdb.Options{Prefix: "test:"})
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

// A reload that changes a tenant's limit keeps its bucket (its key is the
// tenant's name): what was reserved under the old limit stays reserved, and
// settles in the new one.
func TestLimitsReload(t *testing.T) {
	l := limits(t, rdbtest.Start(t))
	old, next := &tenant.Tenant{Name: "team-r", TPM: 1000}, &tenant.Tenant{Name: "team-r", TPM: 2000}
	if d := l.Reserve(old, time.Now(), 800); !d.Allowed {
		t.Fatalf("800 of 1,000: %+v", d)
	}
	// 800 of 1,000 reserved is 48 s of the bucket: 1,600 of 2,000.
	if d := l.Reserve(next, time.Now(), 500); d.Allowed || d.Tokens.Limit != 2000 || d.Tokens.Remaining < 400 || d.Tokens.Remaining > 403 {
		t.Fatalf("500 of the 400 left at 2,000: %+v", d)
	}
	l.Settle(old, time.Now(), 800, 0) // 800 at 1,000 a minute back: full
	if d := l.Reserve(next, time.Now(), 2000); !d.Allowed {
		t.Fatalf("the whole new limit after the refund: %+v", d)
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
