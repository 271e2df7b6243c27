package main

import (
	"context"
	"errors"
	"time"
)

// w2m: workload 2 through two fresh poolds with the same profiles, one
// recording request metrics (the default) and one started with
// --metrics=false, in alternating rounds: what the metrics cost in proxied
// throughput (issue 4: at most 5%). It also checks the setting: the poold
// without metrics exports no request series but still its pool state, the
// other counts requests.
func (b *bench) w2m(ctx context.Context) error {
	on, off, err := b.startMetricsPair(ctx)
	if on != nil {
		defer on.stop()
	}
	if off != nil {
		defer off.stop()
	}
	if err != nil {
		return err
	}
	sh := chat(mFast, 16, false)
	rs, err := b.rotate(ctx, []side{{"metrics on", on.base, b.pc}, {"metrics off", off.base, b.pc}}, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0), nil
	})
	if err != nil {
		return err
	}
	b.checkUsage(rs[0], rs[1], "2m")
	if err := b.checkMetricsSetting(on, off); err != nil {
		return err
	}
	r := pairMed(rs[1], rs[0], reqRate, ratio)
	b.rep.add("2m", "requests/s through poold, metrics off", "", rate(med(rs[1], reqRate)), "", "", nil)
	b.rep.add("2m", "requests/s through poold, metrics on", "", rate(med(rs[0], reqRate)), pct(r)+" of off", "≥ 95% of off", ptr(r >= .95))
	return nil
}

// startMetricsPair starts the two poolds of w2m and waits until both serve.
// It returns those it started even when it fails, for the caller to stop.
func (b *bench) startMetricsPair(ctx context.Context) (on, off *proc, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	profs := profiles(map[string][]string{mFast: nil}, false)
	if on, err = startPoold(b.dir, "poold-metrics-on", b.bin, profs); err != nil {
		return nil, nil, err
	}
	if off, err = startPoold(b.dir, "poold-metrics-off", b.bin, profs, "--metrics=false"); err != nil {
		return on, nil, err
	}
	return on, off, errors.Join(waitPoolsReady(ctx, on), waitPoolsReady(ctx, off))
}

// checkMetricsSetting records a problem unless on counted requests and off
// exported no request series but its pool state.
func (b *bench) checkMetricsSetting(on, off *proc) error {
	onReqs, err := scrape(on.base, "poold_requests_total")
	if err != nil {
		return err
	}
	offReqs, err := scrape(off.base, "poold_requests_total")
	if err != nil {
		return err
	}
	offState, err := scrape(off.base, "poold_pool_state")
	if err != nil {
		return err
	}
	if n := sumMatching(onReqs, `model="`+mFast+`"`); n == 0 {
		b.rep.problem("2m: the poold with metrics on counted no request")
	}
	if len(offReqs) > 0 {
		b.rep.problem("2m: the poold with --metrics=false exported request series: %v", offReqs)
	}
	if len(offState) == 0 {
		b.rep.problem("2m: the poold with --metrics=false exported no poold_pool_state")
	}
	return nil
}
