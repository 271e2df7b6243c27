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

// Tokens are debited after the fact and may put the bucket in debt; a
// tenant in debt is refused on tpm until it is paid back, and the headers
// say what remains.
func TestLimitsTokenDebt(t *testing.T) {
	l := limits(t, rdbtest.Start(t))
	ten := &tenant.Tenant{Name: "team-b", TPM: 1000}
	d := l.Admit(ten, time.Now())
	if !d.Allowed || d.Tokens != (tenant.Bucket{Limit: 1000, Remaining: 1000}) || d.Requests != (tenant.Bucket{}) {
		t.Fatalf("a fresh tenant: %+v", d)
	}
	l.Debit(ten, time.Now(), 400)
	if d := l.Admit(ten, time.Now()); !d.Allowed || d.Tokens.Remaining != 600 && d.Tokens.Remaining != 599 {
		t.Fatalf("after 400 tokens: %+v", d)
	}
	l.Debit(ten, time.Now(), 1500) // 900 in debt
	d = l.Admit(ten, time.Now())
	if d.Allowed || d.Limit != "tpm" {
		t.Fatalf("a tenant in debt was admitted: %+v", d)
	}
	// 900 tokens at 1000 a minute take 54 s to pay back.
	if d.RetryAfter < 50*time.Second || d.RetryAfter > 55*time.Second {
		t.Fatalf("retry after %v, want about 54s", d.RetryAfter)
	}
	if d.Tokens.Remaining != 0 {
		t.Fatalf("remaining tokens in debt: %+v", d.Tokens)
	}
}

// A Redis that cannot be reached lets requests through, telling OnError
// (OnDebitError for a debit), unless FailClosed, which refuses them; the
// first call that reaches it again calls OnRecover, once.
func TestLimitsWithoutRedis(t *testing.T) {
	srv := rdbtest.Run(t)
	l := limits(t, srv.URL)
	var errs, debitErrs, recovered atomic.Int64
	l.OnError = func(err error) {
		if err == nil {
			t.Error("OnError(nil)")
		}
		errs.Add(1)
	}
	l.OnDebitError = func(error) { debitErrs.Add(1) }
	l.OnRecover = func() { recovered.Add(1) }
	ten := &tenant.Tenant{Name: "team-c", RPM: 1, TPM: 10}
	if d := l.Admit(ten, time.Now()); !d.Allowed || recovered.Load() != 0 {
		t.Fatalf("with Redis: %+v, recovered %d", d, recovered.Load())
	}
	srv.Stop()
	if d := l.Admit(ten, time.Now()); !d.Allowed {
		t.Fatalf("fail-open refused: %+v", d)
	}
	l.Debit(ten, time.Now(), 5)
	if errs.Load() != 1 || debitErrs.Load() != 1 {
		t.Fatalf("OnError called %d times and OnDebitError %d, want 1 each", errs.Load(), debitErrs.Load())
	}
	l.FailClosed = true
	if d := l.Admit(ten, time.Now()); d.Allowed || d.Limit != "unchecked" || d.RetryAfter <= 0 {
		t.Fatalf("fail-closed admitted: %+v", d)
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
