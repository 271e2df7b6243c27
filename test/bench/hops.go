package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// w1f: concurrency 1, directly, through poold, through fleetd → poold, and
// through bareproxy → poold, the paths taking turns request by request: the
// latency each path adds to the engine's (the target: the chain adds at most
// twice what poold alone adds). bareproxy is fleetd's forwarding alone; its
// chain is the reference for what any such hop costs here. A plain answer's
// p50 latency, then a 64-token stream's p50 TTFB.
func (b *bench) w1f(ctx context.Context) error {
	f, err := startFleetd(b.dir, b.fleetBin, b.poold.base)
	if err != nil {
		return err
	}
	defer f.stop()
	bare, err := startBare(b.dir, filepath.Join(b.dir, "bareproxy"), b.poold.base)
	if err != nil {
		return err
	}
	defer bare.stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, p := range []*proc{f, bare} {
		if err := waitModels(wctx, p, mFast); err != nil {
			return err
		}
	}
	fc, bc := newClient(64), newClient(64)
	defer fc.CloseIdleConnections()
	defer bc.CloseIdleConnections()
	sides := []side{{"direct", b.direct[mFast].base, b.dc}, {"poold", b.poold.base, b.pc}, {"fleetd", f.base, fc}, {"bare", bare.base, bc}}
	for _, v := range []struct {
		metric string
		sh     shape
		fig    func(*result) float64
	}{
		{"p50 latency", chat(mFast, 16, false), q(.5)},
		{"stream TTFB p50", chat(mFast, 64, true), tq(.5)},
	} {
		rs, err := b.interleave(ctx, sides, v.sh)
		if err != nil {
			return err
		}
		if v.sh.stream {
			for _, r := range slices.Concat(rs[1], rs[2], rs[3]) {
				if r.usage > 0 {
					b.rep.problem("1f: %d streams through poold saw the usage chunk poold asked for", r.usage)
				}
			}
		} else {
			b.checkUsage(rs[1], rs[2], "1f")
		}
		d := us(med(rs[0], v.fig))
		hop := pairMed(rs[0], rs[1], v.fig, added)
		b.rep.add("1f", v.metric+", one hop (poold)", d, us(med(rs[1], v.fig)), plus(hop, us), "", nil)
		for _, c := range []struct {
			i            int
			name, target string
		}{{2, "chain (fleetd → poold)", "≤ 2×"}, {3, "reference chain (bareproxy → poold)", ""}} {
			chain := pairMed(rs[0], rs[c.i], v.fig, added)
			b.rep.add("1f", v.metric+", "+c.name, d, us(med(rs[c.i], v.fig)), plus(chain, us), "", nil)
			x := "n/a"
			if hop > 0 {
				x = fmt.Sprintf("%.2f×", chain/hop)
			}
			var met *bool
			if c.target != "" {
				met = ptr(hop > 0 && chain <= 2*hop)
			}
			b.rep.add("1f", v.metric+", "+c.name+" added ÷ one hop added", "", "", x, c.target, met)
		}
	}
	return nil
}

// interleave runs rounds of dur in which one request at a time goes to each
// side in turn (the order rotating), so that every side meets the same
// moments of a busy machine: sides a few hundred microseconds apart are
// compared within one round instead of across rounds seconds apart. The
// results are per side, one per round, like rotate's.
func (b *bench) interleave(ctx context.Context, sides []side, sh shape) ([][]result, error) {
	out := make([][]result, len(sides))
	for r := range b.o.rounds {
		rs := make([]result, len(sides))
		start := time.Now()
		for i := 0; time.Since(start) < b.o.dur; i++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			for k := range sides {
				j := (i + k) % len(sides)
				rs[j].add(do(ctx, sides[j].client, sides[j].base, sh))
			}
		}
		for j, s := range sides {
			res := &rs[j]
			for _, d := range res.lat {
				res.wall += d // the side's own share of the round
			}
			slices.Sort(res.lat)
			slices.Sort(res.ttfb)
			if err := b.roundDone(s, r, res); err != nil {
				return nil, err
			}
			out[j] = append(out[j], *res)
		}
	}
	return out, nil
}
