package proxy

import "testing"

func TestBodyBudget(t *testing.T) {
	b := &bodyBudget{max: 100}
	hold1, unqueue1, done1 := b.request(60)
	hold2, _, done2 := b.request(60)
	if !hold1() {
		t.Fatal("the first 60 bytes do not fit in 100")
	}
	if hold2() {
		t.Fatal("60 more bytes fit in the 40 left")
	}
	unqueue1() // the first is admitted: its body no longer waits
	if !hold2() {
		t.Fatal("the second does not fit once the first stopped waiting")
	}
	if got := b.waiting.Load(); got != 60 {
		t.Fatalf("waiting %d, want 60", got)
	}
	done1()
	done2() // also gives back what the second held while waiting
	if b.waiting.Load() != 0 || b.live.Load() != 0 {
		t.Fatalf("after both: waiting %d, live %d", b.waiting.Load(), b.live.Load())
	}
	if b.received.Load() != 120 {
		t.Fatalf("received %d, want 120", b.received.Load())
	}
	unbounded := &bodyBudget{}
	hold, _, done := unbounded.request(1 << 40)
	if !hold() {
		t.Fatal("no bound refused a body")
	}
	done()
}
