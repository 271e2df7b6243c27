package main

import (
	"context"
	"errors"
	"time"
)

// settingCost runs workload 2 through two fresh poolds with the same
// profiles, one with the default settings and one started with offFlags, in
// alternating rounds: what a per-request feature costs in proxied
// throughput (target: on ≥ target × off). check, run after the rounds,
// records a problem unless the setting took effect.
func (b *bench) settingCost(ctx context.Context, id, feature string, offFlags []string, target float64, check func(on, off *proc) error) error {
	on, off, stop, err := b.startPair(ctx, id, nil, offFlags)
	defer stop()
	if err != nil {
		return err
	}
	sh := chat(mFast, 16, false)
	rs, err := b.rotate(ctx, []side{{feature + " on", on.base, b.pc}, {feature + " off", off.base, b.pc}}, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0), nil
	})
	if err != nil {
		return err
	}
	b.checkUsage(rs[0], rs[1], id)
	if err := check(on, off); err != nil {
		return err
	}
	r := pairMed(rs[1], rs[0], reqRate, ratio)
	b.rep.add(id, "requests/s through poold, "+feature+" off", "", rate(med(rs[1], reqRate)), "", "", nil)
	b.rep.add(id, "requests/s through poold, "+feature+" on", "", rate(med(rs[0], reqRate)), pct(r)+" of off", "≥ "+pct(target)+" of off", ptr(r >= target))
	return nil
}

// w2m: the request metrics on (the default) and off (--metrics=false)
// (target: at least 95% of off).
func (b *bench) w2m(ctx context.Context) error {
	return b.settingCost(ctx, "2m", "metrics", []string{"--metrics=false"}, .95, b.checkMetricsSetting)
}

// w2u: the usage ledger on (the default) and off (--usage=false)
// (target: at least 95% of off).
func (b *bench) w2u(ctx context.Context) error {
	return b.settingCost(ctx, "2u", "usage ledger", []string{"--usage=false"}, .95, b.checkLedgerSetting)
}

// startPair starts the two poolds of a workload that compares a setting on
// and off, the first with onFlags and the second with offFlags, and waits
// until both serve. stop stops those it started, even when it fails.
func (b *bench) startPair(ctx context.Context, id string, onFlags, offFlags []string) (on, off *proc, stop func(), err error) {
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
	if on, err = startPoold(b.dir, "poold-"+id+"-on", b.bin, profs, onFlags...); err != nil {
		return nil, nil, stop, err
	}
	if off, err = startPoold(b.dir, "poold-"+id+"-off", b.bin, profs, offFlags...); err != nil {
		return on, nil, stop, err
	}
	return on, off, stop, errors.Join(waitPoolsReady(ctx, on), waitPoolsReady(ctx, off))
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
	if n := sumMatching(onReqs, `profile="`+mFast+`"`); n == 0 {
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

// checkLedgerSetting records a problem unless on's ledger wrote request
// rows and dropped none (a ledger that drops would be cheap for the wrong
// reason), and off has no ledger.
func (b *bench) checkLedgerSetting(on, off *proc) error {
	onUsage, err := scrape(on.base, "poold_usage_records_")
	if err != nil {
		return err
	}
	offUsage, err := scrape(off.base, "poold_usage_")
	if err != nil {
		return err
	}
	if n := sumMatching(onUsage, "poold_usage_records_written_total", `kind="request"`); n == 0 {
		b.rep.problem("2u: the poold with the usage ledger wrote no request row")
	}
	if n := sumMatching(onUsage, "poold_usage_records_dropped_total"); n > 0 {
		b.rep.problem("2u: the usage ledger dropped %v records", n)
	}
	if len(offUsage) > 0 {
		b.rep.problem("2u: the poold with --usage=false exported usage series: %v", offUsage)
	}
	return nil
}
