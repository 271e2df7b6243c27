package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/poold/poold/internal/pool"
)

// w5: swap overhead. Pool "swap" alternates between mA and mB, whose engines
// are ready as soon as they listen. Each swap is one request for the other
// profile, timed end to end; the engine's own start time (exec to serving
// /v1/models, polled every millisecond) is measured directly, interleaved
// with the swaps. Each swap is sent a second after the last use of the
// loaded profile, so that no idle grace (a policy, learned from the
// profile's own gaps: see workload 5a) is counted as swap overhead.
func (b *bench) w5(ctx context.Context) error {
	before, err := scrape(b.poold.base, "poold_swap_duration_seconds")
	if err != nil {
		return err
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	loaded, lastUse := mA, time.Now()
	var swaps, starts, stops []float64
	for range b.o.swaps {
		target := mB
		if loaded == mB {
			target = mA
		}
		st, sp, err := b.engineOwnTimes(ctx, target)
		if err != nil {
			return err
		}
		starts, stops = append(starts, st.Seconds()), append(stops, sp.Seconds())
		if err := sleepCtx(ctx, time.Until(lastUse.Add(pool.DefaultIdleGrace+50*time.Millisecond))); err != nil {
			return err
		}
		s := do(ctx, c, b.poold.base, chat(target, 1, false))
		lastUse = time.Now()
		if s.err != nil {
			b.rep.problem("5: swap to %s failed: %v", target, s.err)
			return nil
		}
		swaps = append(swaps, s.lat.Seconds())
		loaded = target
	}
	after, err := scrape(b.poold.base, "poold_swap_duration_seconds")
	if err != nil {
		return err
	}
	swap, start, stop := median(swaps), median(starts), median(stops)
	over := swap - start
	b.rep.add("5", "time per swap p50", "", ms(swap), "", "", nil)
	b.rep.add("5", "engine's own start p50 (direct)", ms(start), "", "", "", nil)
	b.rep.add("5", "engine's own stop p50 (direct)", ms(stop), "", "", "", nil)
	b.rep.add("5", "swap overhead p50 (swap − start)", "", ms(over), "", "≤ 30 ms", ptr(over <= 30e-3))
	b.rep.add("5", "phases, mean ms (poold_swap_duration_seconds)", "", swapPhases(before, after, "swap"), "", "", nil)
	return nil
}

// swapPhases is the mean duration in ms of each phase of the swaps of the
// pool named poolName between two scrapes of poold_swap_duration_seconds.
func swapPhases(before, after map[string]float64, poolName string) string {
	var parts []string
	for _, ph := range []string{"drain", "stop", "start", "ready"} {
		sel := []string{`phase="` + ph + `"`, `pool="` + poolName + `"`}
		n := sumMatching(after, append(sel, "_count")...) - sumMatching(before, append(sel, "_count")...)
		sum := sumMatching(after, append(sel, "_sum")...) - sumMatching(before, append(sel, "_sum")...)
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f", ph, sum/n*1e3))
		}
	}
	return strings.Join(parts, ", ")
}

// w5a: a lone client that alternates two models, one request at a time, at
// poold's default settings (pool "alt": a 30 s minimum residency, the learned
// idle grace): each request is sent as soon as the previous answer is in.
// The engine's own start is measured directly first, so that no measurement
// comes between an answer and the next request. A profile whose client went
// to the other one has no demand left, so the residency does not delay the
// swap: what it costs beyond the engine's own start is the wait for an idle
// pool (the grace, at its floor for a client that never comes back to the
// loaded profile in between) and the stop.
func (b *bench) w5a(ctx context.Context) error {
	var starts []float64
	for i := range b.o.swaps {
		st, _, err := b.engineOwnTimes(ctx, []string{altA, altB}[i%2])
		if err != nil {
			return err
		}
		starts = append(starts, st.Seconds())
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	loaded := altA
	var swaps []float64
	for range b.o.swaps {
		target := altB
		if loaded == altB {
			target = altA
		}
		s := do(ctx, c, b.poold.base, chat(target, 1, false))
		if s.err != nil {
			b.rep.problem("5a: swap to %s failed: %v", target, s.err)
			return nil
		}
		swaps = append(swaps, s.lat.Seconds())
		loaded = target
	}
	swap, start := median(swaps), median(starts)
	over := swap - start
	b.rep.add("5a", "time per swap p50", "", ms(swap), "", "", nil)
	b.rep.add("5a", "engine's own start p50 (direct)", ms(start), "", "", "", nil)
	b.rep.add("5a", "swap overhead p50 (swap − start)", "", ms(over), "", "≤ 30 ms", ptr(over <= 30e-3))
	return nil
}

// engineOwnTimes starts model's engine directly, as poold would, and returns
// how long it took to serve /v1/models and then to exit after SIGTERM.
func (b *bench) engineOwnTimes(ctx context.Context, model string) (start, stop time.Duration, err error) {
	t := time.Now()
	p, err := startEngine(b.dir, b.bin, model)
	if err != nil {
		return 0, 0, err
	}
	defer p.stop()
	if err := waitModels(ctx, p, model); err != nil {
		return 0, 0, err
	}
	start = time.Since(t)
	t = time.Now()
	p.stop()
	return start, time.Since(t), nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// w6: memory, on a fresh poold: RSS after N non-streaming requests, then RSS
// per concurrent slow stream (a token every 5 s).
func (b *bench) w6(ctx context.Context) error {
	p, err := startPoold(b.dir, "poold6", b.bin, profiles(map[string][]string{mFast: nil, mIdle: idleFlags}, false))
	if err != nil {
		return err
	}
	defer p.stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitPoolsReady(wctx, p); err != nil {
		return err
	}
	c := newClient(b.o.idle6 + 64)
	defer c.CloseIdleConnections()
	fresh, err := rss(p.pid())
	if err != nil {
		return err
	}
	res := closedLoop(ctx, c, p.base, chat(mFast, 16, false), 16, 0, b.o.requests6)
	if res.errs > 0 {
		b.rep.problem("6: %d of %d requests failed; first: %v", res.errs, res.n, res.firstErr)
	}
	after, err := rss(p.pid())
	if err != nil {
		return err
	}
	b.rep.add("6", "poold RSS fresh", "", mib(fresh), "", "", nil)
	b.rep.add("6", fmt.Sprintf("poold RSS after %d requests", res.n), "", mib(after), "", "≤ 50 MiB", ptr(after <= 50<<20))

	base, err := rss(p.pid())
	if err != nil {
		return err
	}
	var during int64
	var rssErr error
	errs, err := idleStreams(ctx, c, p.base, b.o.idle6, func() { during, rssErr = rss(p.pid()) })
	if err = errors.Join(err, rssErr); err != nil {
		return err
	}
	if errs > 0 {
		b.rep.problem("6: %d of %d slow streams failed to open", errs, b.o.idle6)
	}
	per := float64(during-base) / float64(b.o.idle6)
	b.rep.add("6", fmt.Sprintf("poold RSS with %d slow streams", b.o.idle6), "", mib(during), "", "", nil)
	b.rep.add("6", "RSS per idle stream", "", fmt.Sprintf("%.1f KiB", per/1024), "", "≤ 32 KiB", ptr(per <= 32<<10))
	return nil
}

// idleStreams opens n slow streams to base (at most 256 opening at a time),
// waits until each has received its first event, calls sample, and closes
// them all. It returns how many failed to open.
func idleStreams(ctx context.Context, c *http.Client, base string, n int, sample func()) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	sh := chat(mIdle, 100, true)
	sem := make(chan struct{}, 256)
	opened := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			resp, err := openStream(ctx, c, base, sh)
			<-sem
			opened <- err
			if err != nil {
				return
			}
			defer resp.Body.Close()
			<-ctx.Done() // hold the stream open until the sample is taken
		}()
	}
	errs := 0
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for range n {
		select {
		case err := <-opened:
			if err != nil {
				errs++
			}
		case <-deadline.C:
			return 0, fmt.Errorf("slow streams did not all open within 2m")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	sample()
	return errs, nil
}

// openStream sends a streaming request and returns once its first data event
// has arrived; the caller closes the body.
func openStream(ctx context.Context, c *http.Client, base string, sh shape) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+sh.path, bytes.NewReader(sh.body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 512)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("reading the first event: %w", err)
		}
		if bytes.HasPrefix(line, dataPrefix) {
			return resp, nil
		}
	}
}

// w7: scale, as Go benchmarks: admission plus resolution at 10 and 10,000
// profiles (internal/pool), and resolution alone (internal/profile).
func (b *bench) w7(ctx context.Context) error {
	out, err := goBench(ctx, b, "github.com/poold/poold/internal/pool", "^BenchmarkAdmitAtScale$")
	if err != nil {
		return err
	}
	out2, err := goBench(ctx, b, "github.com/poold/poold/internal/profile", "^BenchmarkLookupAtScale$")
	if err != nil {
		return err
	}
	for _, set := range []struct {
		what  string
		name  string
		stats map[string]benchStat
	}{{"admission + resolution", "BenchmarkAdmitAtScale", out}, {"resolution (Lookup)", "BenchmarkLookupAtScale", out2}} {
		small, large := set.stats[set.name+"/profiles=10"], set.stats[set.name+"/profiles=10000"]
		if small.ns == 0 || large.ns == 0 {
			return fmt.Errorf("%s: results missing from go test output", set.name)
		}
		r := large.ns / small.ns
		b.rep.add("7", set.what+" ns/op, 10 → 10,000 profiles",
			fmt.Sprintf("%.0f ns", small.ns), fmt.Sprintf("%.0f ns", large.ns), pct(r), "within 10%", ptr(r <= 1.10))
		allocs := fmt.Sprintf("%.0f / %.0f", small.allocs, large.allocs)
		if set.name == "BenchmarkLookupAtScale" {
			b.rep.add("7", set.what+" allocs/op (10 / 10,000)", "", allocs, "", "0", ptr(small.allocs == 0 && large.allocs == 0))
		} else {
			b.rep.add("7", set.what+" allocs/op (10 / 10,000)", "", allocs, "", "", nil)
		}
	}
	return nil
}

type benchStat struct{ ns, bytes, allocs float64 }

// goBench runs one Go benchmark five times (once in smoke mode) with -benchmem and returns the
// median figures of each sub-benchmark, keyed by name without the -GOMAXPROCS
// suffix.
func goBench(ctx context.Context, b *bench, pkg, pattern string) (map[string]benchStat, error) {
	count := "5"
	if b.o.benchtime != defaults().benchtime {
		count = "1" // smoke: correctness only
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", pattern, "-benchmem", "-benchtime", b.o.benchtime, "-count", count, pkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench %s %s: %w\n%s", pattern, pkg, err, out)
	}
	all := map[string][]benchStat{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i]
		}
		var s benchStat
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				s.ns = v
			case "B/op":
				s.bytes = v
			case "allocs/op":
				s.allocs = v
			}
		}
		all[name] = append(all[name], s)
	}
	res := map[string]benchStat{}
	for name, ss := range all {
		sort.Slice(ss, func(i, j int) bool { return ss[i].ns < ss[j].ns })
		res[name] = ss[len(ss)/2]
	}
	logf(b.logw, "%s: %d benchmarks", pkg, len(res))
	return res, nil
}
