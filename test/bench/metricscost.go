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
	on, off, stop, err := b.startPair(ctx, "poold-metrics-on", "poold-metrics-off", "--metrics=false")
	defer stop()
	if err != nil {
		return err
	}
	rs, err := b.onOff(ctx, "2m", "metrics", on, off)
	if err != nil {
		return err
	}
	if err := b.checkMetricsSetting(on, off); err != nil {
		return err
	}
	r := pairMed(rs[1], rs[0], reqRate, ratio)
	b.rep.add("2m", "requests/s through poold, metrics off", "", rate(med(rs[1], reqRate)), "", "", nil)
	b.rep.add("2m", "requests/s through poold, metrics on", "", rate(med(rs[0], reqRate)), pct(r)+" of off", "≥ 95% of off", ptr(r >= .95))
	return nil
}

// startPair starts two fresh poolds serving workload 2's model, the second
// with offFlags, and waits until both serve. stop stops those it started,
// even when it fails.
func (b *bench) startPair(ctx context.Context, onName, offName string, offFlags ...string) (on, off *proc, stop func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stop = func() {
		for _, p := range []*proc{on, off} {
			if p != nil {
				p.stop()
			}
		}
	}
	profs := profiles(map[string][]string{mFast: nil}, false)
	if on, err = startPoold(b.dir, onName, b.bin, profs); err != nil {
		return nil, nil, stop, err
	}
	if off, err = startPoold(b.dir, offName, b.bin, profs, offFlags...); err != nil {
		return on, nil, stop, err
	}
	return on, off, stop, errors.Join(waitPoolsReady(ctx, on), waitPoolsReady(ctx, off))
}

// onOff runs workload 2 through on and off in alternating rounds and
// returns their results, on's first, checking that every answer's usage
// was counted.
func (b *bench) onOff(ctx context.Context, w, what string, on, off *proc) ([][]result, error) {
	sh := chat(mFast, 16, false)
	rs, err := b.rotate(ctx, []side{{what + " on", on.base, b.pc}, {what + " off", off.base, b.pc}}, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0), nil
	})
	if err != nil {
		return nil, err
	}
	b.checkUsage(rs[0], rs[1], w)
	return rs, nil
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
