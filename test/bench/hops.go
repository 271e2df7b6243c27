package main

import (
	"context"
	"fmt"
	"time"
)

// w1f: concurrency 1, directly, through poold, and through fleetd → poold, in
// rotating rounds: the latency each path adds to the engine's (issue 6: the
// chain adds at most twice what poold alone adds). A plain answer's p50
// latency, then a 64-token stream's p50 TTFB.
func (b *bench) w1f(ctx context.Context) error {
	f, err := startFleetd(b.dir, b.fleetBin, b.poold.base)
	if err != nil {
		return err
	}
	defer f.stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitModels(wctx, f, mFast); err != nil {
		return err
	}
	fc := newClient(64)
	defer fc.CloseIdleConnections()
	sides := []side{{"direct", b.direct[mFast].base, b.dc}, {"poold", b.poold.base, b.pc}, {"fleetd", f.base, fc}}
	for _, v := range []struct {
		metric string
		sh     shape
		fig    func(*result) float64
	}{
		{"p50 latency", chat(mFast, 16, false), q(.5)},
		{"stream TTFB p50", chat(mFast, 64, true), tq(.5)},
	} {
		rs, err := b.rotate(ctx, sides, func(s side) (result, error) {
			return closedLoop(ctx, s.client, s.base, v.sh, 1, b.o.dur, 0), nil
		})
		if err != nil {
			return err
		}
		if v.sh.stream {
			for _, r := range append(rs[1], rs[2]...) {
				if r.usage > 0 {
					b.rep.problem("1f: %d streams through poold saw the usage chunk poold asked for", r.usage)
				}
			}
		} else {
			b.checkUsage(rs[1], rs[2], "1f")
		}
		d := us(med(rs[0], v.fig))
		hop := pairMed(rs[0], rs[1], v.fig, added)
		chain := pairMed(rs[0], rs[2], v.fig, added)
		b.rep.add("1f", v.metric+", one hop (poold)", d, us(med(rs[1], v.fig)), plus(hop, us), "", nil)
		b.rep.add("1f", v.metric+", chain (fleetd → poold)", d, us(med(rs[2], v.fig)), plus(chain, us), "", nil)
		x := "n/a"
		if hop > 0 {
			x = fmt.Sprintf("%.2f×", chain/hop)
		}
		b.rep.add("1f", v.metric+", chain added ÷ one hop added", "", "", x, "≤ 2×", ptr(hop > 0 && chain <= 2*hop))
	}
	return nil
}
