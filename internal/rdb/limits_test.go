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
	replicas := []*rdb.Limits{open(t, url).Limits(), open(t, url).Limits()}
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
	if d.Allowed || len(d.Headers) != 3 || d.Headers[0] != [2]string{"x-ratelimit-limit-requests", "60"} ||
		d.Headers[1] != [2]string{"x-ratelimit-remaining-requests", "0"} {
		t.Fatalf("a request over the limit: %+v", d)
	}
}

// Tokens are debited after the fact and may put the bucket in debt; a
// tenant in debt is refused on tpm until it is paid back, and the headers
// say what remains.
func TestLimitsTokenDebt(t *testing.T) {
	l := open(t, rdbtest.Start(t)).Limits()
	ten := &tenant.Tenant{Name: "team-b", TPM: 1000}
	d := l.Admit(ten, time.Now())
	if !d.Allowed || len(d.Headers) != 3 || d.Headers[1] != [2]string{"x-ratelimit-remaining-tokens", "1000"} {
		t.Fatalf("a fresh tenant: %+v", d)
	}
	l.Debit(ten, time.Now(), 400)
	if d := l.Admit(ten, time.Now()); !d.Allowed || d.Headers[1][1] != "600" && d.Headers[1][1] != "599" {
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
	if d.Headers[1][1] != "0" {
		t.Fatalf("remaining tokens in debt: %+v", d.Headers)
	}
}

// A Redis that cannot be reached lets requests through, telling OnError,
// unless FailClosed, which refuses them.
func TestLimitsWithoutRedis(t *testing.T) {
	c := open(t, rdbtest.Start(t))
	l := c.Limits()
	var errs atomic.Int64
	l.OnError = func(err error) {
		if err == nil {
			t.Error("OnError(nil)")
		}
		errs.Add(1)
	}
	c.Close()
	ten := &tenant.Tenant{Name: "team-c", RPM: 1, TPM: 10}
	if d := l.Admit(ten, time.Now()); !d.Allowed {
		t.Fatalf("fail-open refused: %+v", d)
	}
	l.Debit(ten, time.Now(), 5)
	if errs.Load() != 2 {
		t.Fatalf("OnError called %d times, want 2 (admit and debit)", errs.Load())
	}
	l.FailClosed = true
	if d := l.Admit(ten, time.Now()); d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("fail-closed admitted: %+v", d)
	}
	var _ tenant.Limiter = l
}
