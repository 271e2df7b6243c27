package proxy

import (
	"testing"
	"time"
)

// The time per token is a moving average of the answers observed, per
// profile; nothing is estimated for a profile before its first answer, and
// a profile forgotten starts again from nothing.
func TestTokenTimes(t *testing.T) {
	var tt tokenTimes
	if n := tt.estimate("a", time.Second); n != 0 {
		t.Fatalf("estimate before any answer = %d, want 0", n)
	}
	tt.observe("a", time.Second, 100) // 10 ms a token
	if n := tt.estimate("a", 500*time.Millisecond); n != 50 {
		t.Fatalf("estimate at 10 ms a token over 500 ms = %d, want 50", n)
	}
	tt.observe("a", 2*time.Second, 100) // 20 ms: the average moves by a fifth
	if n := tt.estimate("a", 1200*time.Millisecond); n != 100 {
		t.Fatalf("estimate at 12 ms a token over 1.2 s = %d, want 100", n)
	}
	tt.observe("a", time.Second, 0) // no tokens: nothing learnt
	tt.observe("b", 0, 10)
	if n := tt.estimate("b", time.Second); n != 0 {
		t.Fatalf("b learnt from an answer of no duration: %d", n)
	}
	tt.forget(func(id string) bool { return id != "a" })
	if n := tt.estimate("a", time.Second); n != 0 {
		t.Fatalf("a forgotten still estimates %d", n)
	}
}
