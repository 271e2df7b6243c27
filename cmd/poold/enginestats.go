package main

import (
	"context"
	"log/slog"

	"github.com/poold/poold/internal/enginestats"
	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/statusapi"
)

// newEngineStats builds the scraper of the awake engines' metrics, which
// tells asleep of each engine that says it sleeps, or returns nil when
// s.EngineMetricsInterval is zero.
func newEngineStats(s settings, pools func() []statusapi.Pool, asleep func(pool string, pid, port, level int), m *metrics.Metrics, log *slog.Logger) *enginestats.Scraper {
	if s.EngineMetricsInterval <= 0 {
		return nil
	}
	return enginestats.New(enginestats.Options{
		Interval: s.EngineMetricsInterval,
		Timeout:  s.EngineMetricsTimeout,
		Pools:    pools,
		Failed:   m.EngineScrapeFailed,
		Asleep:   asleep,
		Logger:   log,
	})
}

// engineStatsFill is sc's Fill, or nil when sc is.
func engineStatsFill(sc *enginestats.Scraper) func([]statusapi.Pool) {
	if sc == nil {
		return nil
	}
	return sc.Fill
}

// runEngineStats runs sc (if not nil) until ctx ends; wait returns once it
// has stopped.
func runEngineStats(ctx context.Context, sc *enginestats.Scraper) (wait func()) {
	if sc == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc.Run(ctx)
	}()
	return func() { <-done }
}
