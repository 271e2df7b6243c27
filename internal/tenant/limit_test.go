package tenant

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// rpm 60 and 100 requests at once: 60 pass, 40 are refused with when to
// come back; another tenant is not affected.
func TestRequestsPerMinute(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", RPM: 60}
	b := &Tenant{Name: "b", RPM: 60}
	allowed, refused := 0, 0
	for range 100 {
		d := l.Admit(a, t0)
		if d.Allowed {
			allowed++
			continue
		}
		refused++
		if d.Limit != "rpm" || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
			t.Fatalf("refusal %+v, want rpm and about a second", d)
		}
	}
	if allowed != 60 || refused != 40 {
		t.Fatalf("%d allowed, %d refused; want 60 and 40", allowed, refused)
	}
	if d := l.Admit(b, t0); !d.Allowed {
		t.Fatalf("the other tenant was refused: %+v", d)
	}
	// A second later, one more request is allowed.
	if d := l.Admit(a, t0.Add(time.Second)); !d.Allowed {
		t.Fatalf("a second later: %+v", d)
	}
}

// Tokens are not known at admission: a request is admitted while the token
// bucket is not in debt; its tokens, debited at its end, may put the bucket
// in debt, and then requests wait until it is paid back.
func TestTokensPerMinute(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", TPM: 600} // 10 tokens a second
	if d := l.Admit(a, t0); !d.Allowed {
		t.Fatal("a fresh bucket refused")
	}
	l.Debit(a, t0, 1000) // 400 in debt, more than a burst in one debit
	d := l.Admit(a, t0)
	if d.Allowed || d.Limit != "tpm" || d.RetryAfter < 39*time.Second || d.RetryAfter > 41*time.Second {
		t.Fatalf("in debt: %+v, want tpm and 40 s", d)
	}
	if d := l.Admit(a, t0.Add(41*time.Second)); !d.Allowed {
		t.Fatalf("debt paid back: %+v", d)
	}
}

func TestRateLimitHeaders(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", RPM: 60, TPM: 6000}
	d := l.Admit(a, t0)
	if d.Requests != (Bucket{60, 59, time.Second}) || d.Tokens != (Bucket{6000, 6000, 0}) {
		t.Errorf("buckets %+v and %+v; want 60, 59 left, full in 1s and 6000, 6000 left, full now", d.Requests, d.Tokens)
	}
	if d := l.Admit(&Tenant{Name: "free"}, t0); !d.Allowed || d.Requests != (Bucket{}) || d.Tokens != (Bucket{}) {
		t.Errorf("a tenant without limits: %+v", d)
	}
}

// A reload keeps the buckets of tenants whose limits did not change.
func TestApplyKeepsUnchangedBuckets(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", RPM: 2}
	b := &Tenant{Name: "b", RPM: 2}
	for _, tn := range []*Tenant{a, a, b, b} {
		l.Admit(tn, t0)
	}
	a2, b2 := &Tenant{Name: "a", RPM: 2}, &Tenant{Name: "b", RPM: 5}
	l.Apply(&Config{Tenants: []*Tenant{a2, b2}})
	if d := l.Admit(a2, t0); d.Allowed {
		t.Fatal("a's spent bucket was reset by a reload that did not change it")
	}
	if d := l.Admit(b2, t0); !d.Allowed {
		t.Fatal("b's new limit did not give it a new bucket")
	}
}
