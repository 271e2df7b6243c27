package main

import (
	"context"
	"time"

	"github.com/poold/poold/internal/proxy"
)

// waitDrained polls until no request holds a lease on any pool, or ctx ends;
// it reports whether the pools drained.
func waitDrained(ctx context.Context, h *proxy.Handler) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		n := 0
		for _, st := range h.PoolStatus() {
			n += st.InFlight
		}
		if n == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
