package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// The readiness gate of an engine, and the wake of a sleeping one, over
// its HTTP API (proc.API).

// waitReady polls /v1/models until the profile's id is listed: every
// proc.PollInterval, 2 ms at first and at most 100 ms. It fails at once if the
// engine exits, and after timeout.
func (e *engine) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	seen := "no answer yet" // what the last probe found
	for {
		select {
		case <-e.h.Exited():
			return fmt.Errorf("while loading: %w", e.failure())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("engine %q not ready after startupTimeout %s: GET /v1/models: %s; %s", e.profile.ID, timeout, seen, e.lastOutput())
			}
			return ctx.Err()
		case <-t.C:
		}
		ok, found := e.api.Serves(ctx, e.profile.ID)
		if ok {
			return nil
		}
		if ctx.Err() == nil { // a probe cut by the deadline found nothing: keep what the last one did
			seen = found
		}
		t.Reset(proc.PollInterval(time.Since(start), 2*time.Millisecond, 100*time.Millisecond))
	}
}

// wakeUp wakes a sleeping engine: its wake calls and /is_sleeping
// confirming it is fully awake (proc.API.Wake), the readiness gate, and a
// 1-token warm-up probe that proves it generates. timeout bounds it all.
func (e *engine) wakeUp(ctx context.Context, level int, timeout time.Duration) error {
	select {
	case <-e.h.Exited():
		return fmt.Errorf("died while asleep: %w", e.failure())
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := e.api.Wake(ctx, level); err != nil {
		return err
	}
	if err := e.waitReady(ctx, timeout); err != nil {
		return err
	}
	return e.api.WarmUp(ctx, e.profile.ID)
}
