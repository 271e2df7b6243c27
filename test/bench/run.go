package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// The models the harness serves. Each runs the simulator with no artificial
// delay except where a workload needs one: mSlow streams a token every 20 ms
// (workload 4b), mIdle a token every 5 s (workload 6's slow streams).
const (
	mFast = "m"
	mSlow = "m-slow"
	mIdle = "m-idle"
	mA    = "swap-a"
	mB    = "swap-b"
	altA  = "alt-a" // pool "alt", at default settings (workload 5a)
	altB  = "alt-b"
)

var (
	slowFlags = []string{"--sim-itl", "20ms"}
	idleFlags = []string{"--sim-itl", "5s"}
)

// row is one line of the table.
type row struct {
	workload, metric, direct, poold, cmp, target, met string
}

// report is what a run measured: the table, and the correctness problems seen
// (errors, usage not counted), which fail the run.
type report struct {
	rows     []row
	problems []string
	notes    []string
}

func (r *report) add(w, metric, direct, poold, cmp, target string, met *bool) {
	m := ""
	if met != nil {
		m = map[bool]string{true: "yes", false: "**no**"}[*met]
	}
	r.rows = append(r.rows, row{w, metric, direct, poold, cmp, target, m})
}

func (r *report) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

func (r *report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| workload\t metric\t direct\t poold\t ratio / added\t target\t met\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t")
	for _, x := range r.rows {
		fmt.Fprintf(tw, "| %s\t %s\t %s\t %s\t %s\t %s\t %s\t\n", x.workload, x.metric, x.direct, x.poold, x.cmp, x.target, x.met)
	}
	tw.Flush()
	for _, n := range r.notes {
		fmt.Fprintln(w, "note:", n)
	}
	for _, p := range r.problems {
		fmt.Fprintln(w, "PROBLEM:", p)
	}
}

// bench is one run's processes and clients.
type bench struct {
	o        options
	dir      string
	bin      string // poold
	fleetBin string // fleetd
	logw     io.Writer
	rep      *report
	direct   map[string]*proc // engines started directly, by model
	poold    *proc
	dc, pc   *http.Client // direct and poold clients
	real     *realVLLM    // the real-engine workloads' poold, once started
}

// side is one of the ways a workload runs: directly, through poold, through
// fleetd → poold, or through poold with its request metrics off.
type side struct {
	name   string // "direct", "poold", "fleetd", "metrics on" or "metrics off"
	base   string
	client *http.Client
}

// run builds poold, starts the processes and runs every workload.
// The processes' logs are kept in a temporary directory when it fails.
func run(ctx context.Context, o options, logw io.Writer) (rep *report, err error) {
	raiseFileLimit(logw)
	dir, err := os.MkdirTemp("", "poold-bench-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil || (rep != nil && len(rep.problems) > 0) {
			logf(logw, "logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	b := &bench{o: o, dir: dir, bin: filepath.Join(dir, "poold"), fleetBin: filepath.Join(dir, "fleetd"),
		logw: logw, rep: &report{}, direct: map[string]*proc{}}
	logf(logw, "building poold, fleetd and bareproxy")
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"github.com/poold/poold/cmd/poold", "github.com/poold/poold/cmd/fleetd", "github.com/poold/poold/test/bench/bareproxy")
	build.Stdout, build.Stderr = logw, logw
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("building poold, fleetd and bareproxy: %w", err)
	}
	defer b.stopAll()
	if err := b.startAll(ctx); err != nil {
		return b.rep, err
	}
	b.dc, b.pc = newClient(8192), newClient(8192)
	steps := []struct {
		id, name string
		f        func(context.Context) error
	}{
		{"1", "non-streaming, concurrency 1", b.w1},
		{"1f", "concurrency 1 through fleetd → poold", b.w1f},
		{"1c", "a cold burst through fleetd", b.w1c},
		{"1t", "concurrency 1 with a tenants file of 10,000 tenants and without", b.w1t},
		{"2", "non-streaming, concurrency 16", b.w2},
		{"2m", "non-streaming, concurrency 16, poold's request metrics on and off", b.w2m},
		{"2u", "non-streaming, concurrency 16, poold's usage ledger on and off", b.w2u},
		{"2s", "non-streaming, concurrency 16, engine metrics scraped every second and not at all", b.w2s},
		{"3", "streaming 64 tokens, concurrency 16", b.w3},
		{"4", "streaming 256 tokens, concurrency 256", b.w4},
		{"4b", "concurrent slow streams", b.w4b},
		{"5", "swap overhead", b.w5},
		{"5a", "alternating swaps at default settings", b.w5a},
		{"5w", "swap time cold vs wake (sleep mode)", b.w5w},
		{"5r", "restart with loaded pools, engines adopted and not", b.w5r},
		{"6", "memory", b.w6},
		{"7", "scale", b.w7},
		{"1v", "added latency on a real vLLM engine", b.w1v},
		{"5v", "swaps on real vLLM engines", b.w5v},
	}
	var skipped []string
	for _, s := range steps {
		if (s.id == "7" && !o.scale) || (o.only != "" && !slices.Contains(strings.Split(o.only, ","), s.id)) {
			continue
		}
		if o.vllm == "" && slices.Contains(vllmWorkloads, s.id) {
			skipped = append(skipped, s.id)
			continue
		}
		logf(logw, "workload %s: %s", s.id, s.name)
		if err := s.f(ctx); err != nil {
			return b.rep, fmt.Errorf("workload %s: %w", s.name, err)
		}
		b.dc.CloseIdleConnections()
		b.pc.CloseIdleConnections()
	}
	if len(skipped) > 0 {
		b.rep.notes = append(b.rep.notes, fmt.Sprintf("workloads %s skipped: %s", strings.Join(skipped, ", "), noVLLM))
	}
	return b.rep, nil
}

func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// raiseFileLimit lifts the soft limit on open files to the hard one, for the
// thousands of connections of workloads 4b and 6; poold and the engines
// inherit it.
func raiseFileLimit(logw io.Writer) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		logf(logw, "reading the file limit: %v", err)
		return
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		logf(logw, "raising the file limit: %v", err)
	}
}

// profiles renders a profiles file with one pool per model of pools, each
// preloading it, and, when swap is set, a pool "swap" holding mA and mB with
// no minimum residency and a pool "alt" holding altA and altB at default
// settings.
func profiles(pools map[string][]string, swap bool) []byte {
	var ps, profs []map[string]any
	gpu := 0
	for _, model := range slices.Sorted(maps.Keys(pools)) {
		name := "p-" + model
		ps = append(ps, map[string]any{"name": name, "gpus": []int{gpu}, "default": model})
		gpu++
		cmd := append([]string{"{poold}", "engine-sim", "/models/{id}", "--port", "{port}", "--served-model-name", "{id}"}, pools[model]...)
		profs = append(profs, map[string]any{"id": model, "pools": []string{name}, "command": cmd})
	}
	if swap {
		ps = append(ps, map[string]any{"name": "swap", "gpus": []int{gpu}, "default": mA, "minResidency": "0s"},
			map[string]any{"name": "alt", "gpus": []int{gpu + 1}, "default": altA})
		for _, id := range []string{mA, mB, altA, altB} {
			cmd := []string{"{poold}", "engine-sim", "/models/{id}", "--port", "{port}", "--served-model-name", "{id}"}
			pl := "swap"
			if id == altA || id == altB {
				pl = "alt"
			}
			profs = append(profs, map[string]any{"id": id, "pools": []string{pl}, "command": cmd})
		}
	}
	b, _ := json.MarshalIndent(map[string]any{
		"pools": ps, "profiles": profs,
		"defaults": map[string]any{"stopTimeout": "10s", "startupTimeout": "30s"},
	}, "", "  ")
	return b
}

// startAll starts the direct engines and poold, and waits until all serve.
func (b *bench) startAll(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for model, flags := range map[string][]string{mFast: nil, mSlow: slowFlags} {
		p, err := startEngine(b.dir, b.bin, model, flags...)
		if err != nil {
			return err
		}
		b.direct[model] = p
		if err := waitModels(ctx, p, model); err != nil {
			return err
		}
	}
	p, err := startPoold(b.dir, "poold", b.bin, profiles(map[string][]string{mFast: nil, mSlow: slowFlags}, true))
	if err != nil {
		return err
	}
	b.poold = p
	return waitPoolsReady(ctx, p)
}

func (b *bench) stopAll() {
	if b.real != nil {
		if err := b.real.stop(); err != nil {
			logf(b.logw, "stopping the real engines: %v", err)
		}
	}
	if b.poold != nil {
		b.poold.stop()
	}
	for _, p := range b.direct {
		p.stop()
	}
}

// alternate runs f once per side per round, swapping which side goes first
// each round, and returns each side's results in round order.
func (b *bench) alternate(ctx context.Context, model string, f func(s side) (result, error)) (direct, poold []result, err error) {
	rs, err := b.rotate(ctx, []side{{"direct", b.direct[model].base, b.dc}, {"poold", b.poold.base, b.pc}}, f)
	if err != nil {
		return nil, nil, err
	}
	return rs[0], rs[1], nil
}

// rotate runs f once per side per round, the first side of round r being
// sides[r % len(sides)], and returns each side's results in round order,
// indexed like sides.
func (b *bench) rotate(ctx context.Context, sides []side, f func(s side) (result, error)) ([][]result, error) {
	out := make([][]result, len(sides))
	for r := range b.o.rounds {
		for k := range sides {
			i := (r + k) % len(sides)
			s := sides[i]
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			res, err := f(s)
			if err != nil {
				return nil, fmt.Errorf("%s round %d: %w", s.name, r+1, err)
			}
			if err := b.roundDone(s, r, &res); err != nil {
				return nil, err
			}
			out[i] = append(out[i], res)
		}
	}
	return out, nil
}

// roundDone logs one side's round and reports its failed requests as a
// problem; a round in which none succeeded is an error.
func (b *bench) roundDone(s side, r int, res *result) error {
	if res.errs > 0 {
		b.rep.problem("%s round %d: %d of %d requests failed; first: %v", s.name, r+1, res.errs, res.n, res.firstErr)
	}
	logf(b.logw, "  round %d %-6s: %d requests, %d errors, latency p50 %v, TTFB p50 %v p99 %v, %.0f chunks/s",
		r+1, s.name, res.n, res.errs, quantile(res.lat, .5), quantile(res.ttfb, .5), quantile(res.ttfb, .99), chunkRate(res))
	if res.n == res.errs {
		return fmt.Errorf("%s round %d: no request succeeded", s.name, r+1)
	}
	return nil
}

// med is the median of f over rs.
func med(rs []result, f func(*result) float64) float64 {
	xs := make([]float64, len(rs))
	for i := range rs {
		xs[i] = f(&rs[i])
	}
	return median(xs)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pairMed is the median over rounds of f(poold round) compared with
// f(direct round) by cmp (a ratio or a difference).
func pairMed(d, p []result, f func(*result) float64, cmp func(d, p float64) float64) float64 {
	xs := make([]float64, len(d))
	for i := range d {
		xs[i] = cmp(f(&d[i]), f(&p[i]))
	}
	return median(xs)
}

func ratio(d, p float64) float64 { return p / d }
func added(d, p float64) float64 { return p - d }

func q(qq float64) func(*result) float64 {
	return func(r *result) float64 { return quantile(r.lat, qq).Seconds() }
}

func tq(qq float64) func(*result) float64 {
	return func(r *result) float64 { return quantile(r.ttfb, qq).Seconds() }
}

func reqRate(r *result) float64   { return r.perSecond(int64(r.n - r.errs)) }
func chunkRate(r *result) float64 { return r.perSecond(r.chunks) }

func errCount(rs []result) int {
	n := 0
	for _, r := range rs {
		n += r.errs
	}
	return n
}

func us(s float64) string   { return fmt.Sprintf("%.0f µs", s*1e6) }
func ms(s float64) string   { return fmt.Sprintf("%.1f ms", s*1e3) }
func ms2(s float64) string  { return fmt.Sprintf("%.2f ms", s*1e3) }
func pct(x float64) string  { return fmt.Sprintf("%.0f%%", x*100) }
func rate(x float64) string { return fmt.Sprintf("%.0f/s", x) }
func mib(b int64) string    { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func plus(x float64, f func(float64) string) string {
	if x < 0 {
		return "−" + f(-x)
	}
	return "+" + f(x)
}

func ptr(b bool) *bool { return &b }

// w1: non-streaming, concurrency 1: p50 and p99 latency.
func (b *bench) w1(ctx context.Context) error {
	sh := chat(mFast, 16, false)
	d, p, err := b.alternate(ctx, mFast, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 1, b.o.dur, 0), nil
	})
	if err != nil {
		return err
	}
	b.checkUsage(d, p, "1")
	a50 := pairMed(d, p, q(.5), added)
	b.rep.add("1", "p50 latency", us(med(d, q(.5))), us(med(p, q(.5))), plus(a50, us), "added ≤ 100 µs", ptr(a50 <= 100e-6))
	a99 := pairMed(d, p, q(.99), added)
	b.rep.add("1", "p99 latency", us(med(d, q(.99))), us(med(p, q(.99))), plus(a99, us), "", nil)
	return nil
}

// w2: non-streaming, concurrency 16: requests/s.
func (b *bench) w2(ctx context.Context) error {
	sh := chat(mFast, 16, false)
	d, p, err := b.alternate(ctx, mFast, func(s side) (result, error) {
		return closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0), nil
	})
	if err != nil {
		return err
	}
	b.checkUsage(d, p, "2")
	r := pairMed(d, p, reqRate, ratio)
	b.rep.add("2", "requests/s", rate(med(d, reqRate)), rate(med(p, reqRate)), pct(r), "≥ 40%", ptr(r >= .40))
	return nil
}

// w3: streaming 64 tokens, concurrency 16: chunks/s and TTFB p50. It also
// checks that poold counted every stream's usage and withheld the usage
// chunk it asked for.
func (b *bench) w3(ctx context.Context) error {
	const tokens = 64
	sh := chat(mFast, tokens, true)
	var counted float64
	var streams int
	d, p, err := b.alternate(ctx, mFast, func(s side) (result, error) {
		if s.name == "direct" {
			return closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0), nil
		}
		before, err := scrape(b.poold.base, "poold_completion_tokens_total")
		if err != nil {
			return result{}, err
		}
		res := closedLoop(ctx, s.client, s.base, sh, 16, b.o.dur, 0)
		after, err := scrape(b.poold.base, "poold_completion_tokens_total")
		if err != nil {
			return result{}, err
		}
		sel := `profile="` + mFast + `"`
		counted += sumMatching(after, sel) - sumMatching(before, sel)
		streams += res.n - res.errs
		return res, nil
	})
	if err != nil {
		return err
	}
	if want := float64(streams * tokens); counted != want {
		b.rep.problem("3: poold counted %.0f completion tokens for %d streams of %d tokens, want %.0f", counted, streams, tokens, want)
	}
	for _, r := range p {
		if r.usage > 0 {
			b.rep.problem("3: %d streams through poold saw the usage chunk poold asked for", r.usage)
		}
	}
	r := pairMed(d, p, chunkRate, ratio)
	b.rep.add("3", "chunks/s", rate(med(d, chunkRate)), rate(med(p, chunkRate)), pct(r), "≥ 85%", ptr(r >= .85))
	a := pairMed(d, p, tq(.5), added)
	b.rep.add("3", "TTFB p50", us(med(d, tq(.5))), us(med(p, tq(.5))), plus(a, us), "added ≤ 150 µs", ptr(a <= 150e-6))
	b.rep.add("3", "usage counted by poold", "", fmt.Sprintf("%.0f tokens / %d streams", counted, streams), "", "all", ptr(counted == float64(streams*tokens)))
	return nil
}

// checkUsage records a problem for any successful non-streaming answer that
// carried no usage.
func (b *bench) checkUsage(d, p []result, w string) {
	for _, rs := range [][]result{d, p} {
		for _, r := range rs {
			if ok := r.n - r.errs; r.usage != ok {
				b.rep.problem("%s: %d of %d answers carried usage", w, r.usage, ok)
			}
		}
	}
}

// w4: streaming 256 tokens, concurrency 256: chunks/s, errors, and CPU time
// per 1,000 chunks of poold and of the engine.
func (b *bench) w4(ctx context.Context) error {
	sh := chat(mFast, 256, true)
	var pooldCPU, engCPU, directCPU []float64
	d, p, err := b.alternate(ctx, mFast, func(s side) (result, error) {
		pids := []int{b.direct[mFast].pid()}
		if s.name == "poold" {
			eng, err := enginePID(b.poold.base, "p-"+mFast)
			if err != nil {
				return result{}, err
			}
			pids = []int{b.poold.pid(), eng}
		}
		before := make([]time.Duration, len(pids))
		for i, pid := range pids {
			t, err := cpuTime(pid)
			if err != nil {
				return result{}, fmt.Errorf("reading CPU time: %w", err)
			}
			before[i] = t
		}
		res := closedLoop(ctx, s.client, s.base, sh, 256, b.o.dur, 0)
		per := func(i int) float64 {
			t, _ := cpuTime(pids[i])
			return (t - before[i]).Seconds() / (float64(res.chunks) / 1000)
		}
		if s.name == "poold" {
			pooldCPU = append(pooldCPU, per(0))
			engCPU = append(engCPU, per(1))
		} else {
			directCPU = append(directCPU, per(0))
		}
		return res, nil
	})
	if err != nil {
		return err
	}
	r := pairMed(d, p, chunkRate, ratio)
	b.rep.add("4", "chunks/s", rate(med(d, chunkRate)), rate(med(p, chunkRate)), pct(r), "", nil)
	b.rep.add("4", "errors", fmt.Sprint(errCount(d)), fmt.Sprint(errCount(p)), "", "0", ptr(errCount(p) == 0))
	b.rep.add("4", "poold CPU per 1,000 chunks", "", ms(median(pooldCPU)), "", "reported", nil)
	b.rep.add("4", "engine CPU per 1,000 chunks", ms(median(directCPU)), ms(median(engCPU)), "", "", nil)
	return nil
}

// w4b: many concurrent streams, 64 tokens 20 ms apart: errors, chunks/s,
// TTFB, and poold's RSS during and after.
func (b *bench) w4b(ctx context.Context) error {
	sh := chat(mSlow, 64, true)
	var peak int64
	d, p, err := b.alternate(ctx, mSlow, func(s side) (result, error) {
		if s.name == "direct" {
			return closedLoop(ctx, s.client, s.base, sh, b.o.streams4b, b.o.dur4b, 0), nil
		}
		stop := make(chan struct{})
		sampled := make(chan int64)
		go func() { sampled <- sampleMaxRSS(b.poold.pid(), stop) }()
		res := closedLoop(ctx, s.client, s.base, sh, b.o.streams4b, b.o.dur4b, 0)
		close(stop)
		peak = max(peak, <-sampled)
		return res, nil
	})
	if err != nil {
		return err
	}
	after, err := rss(b.poold.pid())
	if err != nil {
		return err
	}
	w := fmt.Sprintf("4b (%d streams)", b.o.streams4b)
	b.rep.add(w, "errors", fmt.Sprint(errCount(d)), fmt.Sprint(errCount(p)), "", "0", ptr(errCount(p) == 0))
	r := pairMed(d, p, chunkRate, ratio)
	b.rep.add(w, "chunks/s", rate(med(d, chunkRate)), rate(med(p, chunkRate)), pct(r), "≥ 90%", ptr(r >= .90))
	a50 := pairMed(d, p, tq(.5), added)
	b.rep.add(w, "TTFB p50", ms(med(d, tq(.5))), ms(med(p, tq(.5))), plus(a50, ms), "≤ direct + 10 ms", ptr(a50 <= 10e-3))
	a99 := pairMed(d, p, tq(.99), added)
	b.rep.add(w, "TTFB p99", ms(med(d, tq(.99))), ms(med(p, tq(.99))), plus(a99, ms), "", nil)
	b.rep.add(w, "poold RSS during (peak)", "", mib(peak), "", "", nil)
	b.rep.add(w, "poold RSS after", "", mib(after), "", "≤ 100 MB", ptr(after <= 100e6))
	return nil
}

// sampleMaxRSS samples pid's RSS every 50 ms until stop is closed and returns
// the largest.
func sampleMaxRSS(pid int, stop <-chan struct{}) int64 {
	var peak int64
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if v, err := rss(pid); err == nil {
			peak = max(peak, v)
		}
		select {
		case <-stop:
			return peak
		case <-tick.C:
		}
	}
}
