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

// A request takes its worst case from the token bucket once its body is
// read: 600 tokens a minute hold three of 200 and refuse the fourth, until
// a refund or the refill puts enough back; a refund never fills the bucket
// past its size, and tokens used beyond a reservation put it in debt, where
// Admit refuses until the debt is paid back.
func TestTokensPerMinute(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", TPM: 600} // 10 tokens a second
	if d := l.Admit(a, t0); !d.Allowed {
		t.Fatal("a fresh bucket refused")
	}
	for i := range 3 {
		if d := l.Reserve(a, t0, 200); !d.Allowed || d.Tokens.Remaining != 400-200*i {
			t.Fatalf("reservation %d: %+v", i, d)
		}
	}
	d := l.Reserve(a, t0, 200)
	if d.Allowed || d.Limit != "tpm" || d.RetryAfter != 20*time.Second || d.Tokens.Remaining != 0 {
		t.Fatalf("a fourth 200 of 600: %+v, want tpm and 20 s", d)
	}
	if d := l.Admit(a, t0); !d.Allowed {
		t.Fatalf("an empty bucket, not in debt, refused at admission: %+v", d)
	}

	// The first used 50 of its 200: 150 back, enough for another.
	l.Settle(a, t0, 200, 50)
	if d := l.Reserve(a, t0, 150); !d.Allowed || d.Tokens.Remaining != 0 {
		t.Fatalf("after a refund of 150: %+v", d)
	}
	// Five seconds refill 50.
	if d := l.Reserve(a, t0.Add(5*time.Second), 50); !d.Allowed {
		t.Fatalf("after 5 s: %+v", d)
	}

	// Refunds do not fill past the size: 4 × 200 reserved, 0 used.
	for range 4 {
		l.Settle(a, t0.Add(5*time.Second), 200, 0)
	}
	if d := l.Reserve(a, t0.Add(5*time.Second), 0); d.Tokens.Remaining != 600 {
		t.Fatalf("refunded past the size: %+v", d)
	}

	// 100 reserved of a full bucket and 1,000 used: 900 more taken from the
	// 500 left, 400 in debt, refused until paid back.
	now := t0.Add(time.Minute)
	l.Reserve(a, now, 100)
	l.Settle(a, now, 100, 1000)
	if d := l.Admit(a, now); d.Allowed || d.Limit != "tpm" || d.RetryAfter != 40*time.Second || d.Tokens.Remaining != 0 {
		t.Fatalf("400 in debt: %+v, want tpm and 40 s", d)
	}
	if d := l.Reserve(a, now.Add(40*time.Second), 1); d.Allowed {
		t.Fatalf("the debt just paid back, an empty bucket reserved: %+v", d)
	}
	if d := l.Admit(a, now.Add(41*time.Second)); !d.Allowed {
		t.Fatalf("debt paid back: %+v", d)
	}
}

// A worst case above the whole limit is taken only from a full bucket, which
// it puts in debt: it waits for the bucket to fill, not forever.
func TestReserveAboveTheLimit(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", TPM: 600}
	l.Reserve(a, t0, 60)
	d := l.Reserve(a, t0, 1000)
	if d.Allowed || d.Limit != "tpm" || d.RetryAfter != 6*time.Second {
		t.Fatalf("1,000 of a bucket of 540: %+v, want refused until full, in 6 s", d)
	}
	l.Settle(a, t0, 60, 0)
	if d := l.Reserve(a, t0, 1000); !d.Allowed {
		t.Fatalf("1,000 of a full bucket of 600: %+v", d)
	}
	if d := l.Admit(a, t0); d.Allowed || d.RetryAfter != 40*time.Second {
		t.Fatalf("400 in debt after it: %+v", d)
	}
	// It used 700: 300 back, the debt is 100.
	l.Settle(a, t0, 1000, 700)
	if d := l.Admit(a, t0); d.Allowed || d.RetryAfter != 10*time.Second {
		t.Fatalf("100 in debt: %+v", d)
	}
	// Without a tpm, nothing is reserved or settled.
	free := &Tenant{Name: "free", RPM: 10}
	if d := l.Reserve(free, t0, 1<<20); !d.Allowed || d.Tokens != (Bucket{}) {
		t.Fatalf("a tenant without tpm: %+v", d)
	}
	l.Settle(free, t0, 0, 1<<20)
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

// A reload keeps the buckets of tenants whose limits did not change; a
// request admitted before it settles with the bucket in force, and one of a
// tenant that is gone settles with nothing.
func TestApplyKeepsUnchangedBuckets(t *testing.T) {
	var l Limits
	a := &Tenant{Name: "a", RPM: 2, TPM: 100}
	b := &Tenant{Name: "b", RPM: 2, TPM: 100}
	c := &Tenant{Name: "c", TPM: 100}
	for _, tn := range []*Tenant{a, a, b, b, c} {
		l.Admit(tn, t0)
		l.Reserve(tn, t0, 40)
	}
	a2, b2 := &Tenant{Name: "a", RPM: 2, TPM: 100}, &Tenant{Name: "b", RPM: 5, TPM: 200}
	l.Apply(&Config{Tenants: []*Tenant{a2, b2}})
	if d := l.Admit(a2, t0); d.Allowed || d.Tokens.Remaining != 20 {
		t.Fatalf("a's spent buckets were reset by a reload that did not change them: %+v", d)
	}
	if d := l.Admit(b2, t0); !d.Allowed || d.Tokens.Remaining != 200 {
		t.Fatalf("b's new limits did not give it new buckets: %+v", d)
	}
	// b's requests in flight, made under tpm 100, settle in its new bucket,
	// which they neither replace nor fill past its size.
	l.Reserve(b2, t0, 150)
	l.Settle(b, t0, 40, 0)
	l.Settle(b, t0, 40, 0)
	if d := l.Reserve(b2, t0, 0); d.Tokens != (Bucket{200, 130, 21 * time.Second}) {
		t.Fatalf("b's bucket after the settlements of requests from before the reload: %+v", d.Tokens)
	}
	l.Settle(c, t0, 40, 1000) // c is gone: nothing to settle, no bucket made
	if d := l.Reserve(&Tenant{Name: "c", TPM: 100}, t0, 100); !d.Allowed {
		t.Fatalf("c, back, has a fresh bucket: %+v", d)
	}
}
