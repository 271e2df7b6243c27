package main

import (
	"context"
	"time"
)

// w2s: engine metrics read every second (the default) and not at all
// (--engine-metrics-interval=0): what the scrape costs plain requests
// (target: at most 3%).
func (b *bench) w2s(ctx context.Context) error {
	return b.settingCost(ctx, "2s", "engine metrics scraped every 1s", []string{"--engine-metrics-interval=0"}, .97,
		func(on, off *proc) error { return b.checkScrapeSetting(ctx, on, off) })
}

// checkScrapeSetting records a problem unless on exports its engine's load
// (poold_engine_requests_running, within 10 s: the first scrape comes a
// second after the start) and off does not.
func (b *bench) checkScrapeSetting(ctx context.Context, on, off *proc) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		onRunning, err := scrape(on.base, "poold_engine_requests_running")
		if err != nil {
			return err
		}
		if len(onRunning) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			b.rep.problem("2s: the scraping poold exported no poold_engine_requests_running")
			return nil
		case <-tick.C:
		}
	}
	offRunning, err := scrape(off.base, "poold_engine_requests_running")
	if err != nil {
		return err
	}
	if len(offRunning) > 0 {
		b.rep.problem("2s: the poold with --engine-metrics-interval=0 exported %v", offRunning)
	}
	return nil
}
