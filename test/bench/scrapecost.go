package main

import (
	"context"
	"time"
)

// w2s: workload 2 through two fresh poolds with the same profiles, one
// reading its engine's /metrics every second (the default) and one started
// with --engine-metrics-interval=0, in alternating rounds: what the scrape
// costs plain requests (issue 20: at most 3%). It also checks the setting:
// the scraping poold exports its engine's load, the other none.
func (b *bench) w2s(ctx context.Context) error {
	on, off, stop, err := b.startPair(ctx, "poold-scrape-on", "poold-scrape-off", "--engine-metrics-interval=0")
	defer stop()
	if err != nil {
		return err
	}
	rs, err := b.onOff(ctx, "2s", "scraping", on, off)
	if err != nil {
		return err
	}
	if err := b.checkScrapeSetting(ctx, on, off); err != nil {
		return err
	}
	r := pairMed(rs[1], rs[0], reqRate, ratio)
	b.rep.add("2s", "requests/s through poold, engine metrics not scraped", "", rate(med(rs[1], reqRate)), "", "", nil)
	b.rep.add("2s", "requests/s through poold, engine metrics scraped every 1s", "", rate(med(rs[0], reqRate)), pct(r)+" of off", "≥ 97% of off", ptr(r >= .97))
	return nil
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
