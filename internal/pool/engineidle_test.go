package pool

import (
	"testing"
	"time"
)

func TestIdleTimeout(t *testing.T) {
	for _, tt := range []struct {
		env  []string
		want time.Duration
	}{
		{nil, 4 * time.Second},
		{[]string{"PATH=/bin", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=10"}, 8 * time.Second},
		{[]string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=10", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=2"}, 1600 * time.Millisecond}, // the profile's wins over poold's own
		{[]string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=1.5"}, 4 * time.Second},                                          // not an int: vLLM refuses it
		{[]string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE=0"}, time.Nanosecond},
		{[]string{"XVLLM_HTTP_TIMEOUT_KEEP_ALIVE=1"}, 4 * time.Second},
	} {
		if got := idleTimeout(tt.env); got != tt.want {
			t.Errorf("%q: %v, want %v", tt.env, got, tt.want)
		}
	}
}
