package proxy

import (
	"sync"
	"time"
)

// tokenTimes learns, for each profile, how long its engine takes to make
// one token of one sequence, from the answers that end with the engine's
// usage: poold's estimate of what an answer the client abandoned before its
// end cost the engine (see estimate). The zero value knows nothing yet; it
// is safe for concurrent use.
type tokenTimes struct {
	mu  sync.Mutex               // guards per
	per map[string]time.Duration // profile id → a moving average of the time per token
}

// tokenTimeWeight is the weight of the newest answer in the moving average.
const tokenTimeWeight = 0.2

// observe adds an answer of profile that made tokens per sequence in d, the
// time from its forward to its end (its prefill included, so that the
// estimate errs high on short answers).
func (t *tokenTimes) observe(profile string, d time.Duration, tokens int) {
	if tokens <= 0 || d <= 0 {
		return
	}
	per := d / time.Duration(tokens)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.per == nil {
		t.per = make(map[string]time.Duration)
	}
	if old, ok := t.per[profile]; ok {
		per = time.Duration(float64(old)*(1-tokenTimeWeight) + float64(per)*tokenTimeWeight)
	}
	t.per[profile] = max(per, time.Nanosecond)
}

// estimate is how many tokens per sequence profile's engine made in d, at
// the time per token observed so far; 0 before any answer was observed.
func (t *tokenTimes) estimate(profile string, d time.Duration) int64 {
	t.mu.Lock()
	per := t.per[profile]
	t.mu.Unlock()
	if per <= 0 || d <= 0 {
		return 0
	}
	return int64(d / per)
}

// forget drops the profiles that keep does not report as known: a reload
// that removes a profile removes what was learnt of it.
func (t *tokenTimes) forget(keep func(profile string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range t.per {
		if !keep(p) {
			delete(t.per, p)
		}
	}
}
