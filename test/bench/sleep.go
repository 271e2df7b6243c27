package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/poold/poold/internal/pool"
)

// The sleep-enabled models of workload 5w.
var sleepModels = []string{"sleep-a", "sleep-b", "sleep-c"}

// sleepProfiles renders workload 5w's profiles file: pool "sleep" holding
// sleepModels, each a level-1 sleep-enabled simulator that loads cold in load
// and wakes in wake, with no minimum residency and at most one sleeper.
func sleepProfiles(load, wake time.Duration) []byte {
	var profs []map[string]any
	for _, id := range sleepModels {
		cmd := []string{"{poold}", "engine-sim", "/models/{id}", "--port", "{port}", "--served-model-name", "{id}",
			"--enable-sleep-mode", "--sim-load-delay", load.String(), "--sim-wake-delay", wake.String()}
		profs = append(profs, map[string]any{"id": id, "pools": []string{"sleep"}, "command": cmd,
			"sleep": map[string]any{"level": 1}, "weightBytes": 1 << 20})
	}
	b, _ := json.MarshalIndent(map[string]any{
		"pools":    []map[string]any{{"name": "sleep", "gpus": []int{0}, "default": sleepModels[0], "minResidency": "0s", "maxSleeping": 1}},
		"profiles": profs,
		"defaults": map[string]any{"stopTimeout": "10s", "startupTimeout": "30s"},
	}, "", "  ")
	return b
}

// w5w: swap time cold vs wake (docs/sleep-mode.md), on a poold of its own
// whose pool keeps one sleeper. Each swap is one request for another
// profile, timed end to end, sent once pool.DefaultIdleGrace has passed (as
// in workload 5). First the pool rotates through the three models, so that
// every swap finds its target evicted and starts it cold (putting the old
// engine to sleep and stopping the older sleeper on the way); then it
// alternates between the last two, so that every swap wakes its target. The
// kind of each swap is checked against poold_swap_duration_seconds.
func (b *bench) w5w(ctx context.Context) error {
	wake := b.o.load5w / 15
	p, err := startPoold(b.dir, "poold5w", b.bin, sleepProfiles(b.o.load5w, wake))
	if err != nil {
		return err
	}
	defer p.stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitPoolsReady(wctx, p); err != nil {
		return err
	}
	c := newClient(4)
	defer c.CloseIdleConnections()

	n := b.o.swaps5w
	targets := make([]string, 0, 2*n) // cold: b, c, a, b, …; then wake: back and forth
	for i := range n {
		targets = append(targets, sleepModels[(i+1)%len(sleepModels)])
	}
	last, prev := targets[n-1], sleepModels[(n-1)%len(sleepModels)]
	for i := range n {
		targets = append(targets, []string{prev, last}[i%2])
	}
	var cold, warm []float64
	lastUse := time.Now()
	for i, target := range targets {
		want := pool.KindCold
		if i >= n {
			want = pool.KindWake
		}
		if err := sleepCtx(ctx, time.Until(lastUse.Add(pool.DefaultIdleGrace+50*time.Millisecond))); err != nil {
			return err
		}
		before, err := swapCounts(p.base)
		if err != nil {
			return err
		}
		s := do(ctx, c, p.base, chat(target, 1, false))
		lastUse = time.Now()
		if s.err != nil {
			b.rep.problem("5w: swap %d to %s failed: %v", i+1, target, s.err)
			return nil
		}
		after, err := swapCounts(p.base)
		if err != nil {
			return err
		}
		if got := map[string]float64{pool.KindCold: after[0] - before[0], pool.KindWake: after[1] - before[1]}; got[want] != 1 || got[pool.KindCold]+got[pool.KindWake] != 1 {
			b.rep.problem("5w: swap %d to %s: %v cold and %v wake swaps counted, want one %s", i+1, target, got[pool.KindCold], got[pool.KindWake], want)
		}
		logf(b.logw, "  swap %d to %s (%s): %v", i+1, target, want, s.lat)
		if want == pool.KindCold {
			cold = append(cold, s.lat.Seconds())
		} else {
			warm = append(warm, s.lat.Seconds())
		}
	}
	cp, wp := median(cold), median(warm)
	w := fmt.Sprintf("5w (load %v, wake %v)", b.o.load5w, wake)
	b.rep.add(w, fmt.Sprintf("cold swap p50 (%d swaps)", len(cold)), "", ms(cp), "", "", nil)
	b.rep.add(w, fmt.Sprintf("wake swap p50 (%d swaps)", len(warm)), "", ms(wp), "", "", nil)
	b.rep.add(w, "swap time cold ÷ wake", "", "", fmt.Sprintf("%.1f×", cp/wp), "≥ 10×", ptr(cp >= 10*wp))
	return nil
}

// swapCounts reads how many swaps of pool "sleep" ended with a started engine
// ready (cold) and with a sleeping one woken (wake), from the count of that
// last phase in poold_swap_duration_seconds.
func swapCounts(base string) ([2]float64, error) {
	m, err := scrape(base, "poold_swap_duration_seconds_count")
	if err != nil {
		return [2]float64{}, err
	}
	return [2]float64{
		sumMatching(m, `pool="sleep"`, `kind="cold"`, `phase="ready"`),
		sumMatching(m, `pool="sleep"`, `kind="wake"`, `phase="wake"`),
	}, nil
}
