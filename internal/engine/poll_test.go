package engine

import (
	"testing"
	"time"
)

// A poll waits a tenth of the time taken so far, within its bounds: a wait
// ends at most a tenth late (or the floor, early on), never twice as long.
func TestPollInterval(t *testing.T) {
	const ms = time.Millisecond
	for _, tt := range []struct{ elapsed, want time.Duration }{
		{0, 2 * ms},
		{15 * ms, 2 * ms},
		{30 * ms, 3 * ms},
		{500 * ms, 50 * ms},
		{time.Second, 100 * ms},
		{10 * time.Minute, 100 * ms},
	} {
		if got := PollInterval(tt.elapsed, 2*ms, 100*ms); got != tt.want {
			t.Errorf("PollInterval(%v, 2ms, 100ms) = %v, want %v", tt.elapsed, got, tt.want)
		}
	}
}
