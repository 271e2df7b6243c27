// Command schedbench measures the swap scheduler against real processes: it
// builds poold, runs it on loopback with two simulator profiles that take
// -load-delay to load, drives the thrash and starvation workloads for -dur
// each, once with the scheduling policy (minResidency -residency) and once
// with the plain FIFO baseline (minResidency 0: the gate closes as soon as
// another profile waits), and prints one table side by side.
//
//	go run ./test/schedbench [-dur 15s] [-residency 3s] [-load-delay 1s]
//
// Waits are the access log's queue_wait_ms of the requests served. The
// figures depend on the machine; the comparison between the rows is the
// result. docs/benchmarks.md keeps the latest table.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	dur := flag.Duration("dur", 15*time.Second, "how long each workload runs under each policy")
	residency := flag.Duration("residency", 3*time.Second, "minResidency of the policy rows")
	loadDelay := flag.Duration("load-delay", time.Second, "how long each simulated model takes to load")
	bin := flag.String("poold", "", "a built poold binary (default: build one)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin, *dur, *residency, *loadDelay); err != nil {
		fmt.Fprintln(os.Stderr, "schedbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, dur, residency, loadDelay time.Duration) error {
	dir, err := os.MkdirTemp("", "schedbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin == "" {
		bin = filepath.Join(dir, "poold")
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/poold")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building poold (run from the module root): %w", err)
		}
	}
	fmt.Printf("schedbench: %s/%s, %d CPUs, %s; each run %s, simulated load %s\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), dur, loadDelay)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tpolicy\tswaps\tserved a\tserved b\tfailed\twait p50\twait p99\tb wait p99\t")
	for _, w := range []workload{thrash, starvation} {
		for _, res := range []time.Duration{residency, 0} {
			r, err := measure(ctx, bin, dir, w, res, loadDelay, dur)
			if err != nil {
				return fmt.Errorf("%s with minResidency %s: %w", w.name, res, err)
			}
			policy := "minResidency " + res.String()
			if res == 0 {
				policy = "FIFO (minResidency 0)"
			}
			all := append(slices.Clone(r.waits["a"]), r.waits["b"]...)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", w.name, policy, r.swaps,
				len(r.waits["a"]), len(r.waits["b"]), r.failed, pct(all, 50), pct(all, 99), pct(r.waits["b"], 99))
		}
	}
	return tw.Flush()
}

// A workload is a set of clients started together and stopped after the run.
type workload struct {
	name    string
	clients []client
}

// A client sends the same request in a closed loop, pausing think between a
// response and the next request.
type client struct {
	model  string
	stream bool
	tokens int
	think  time.Duration
}

var (
	// thrash: one client always wants a, the other always b.
	thrash = workload{"thrash", []client{{"a", false, 5, 0}, {"b", false, 5, 0}}}
	// starvation: two a streams keep one always in flight; b comes now and
	// then.
	starvation = workload{"starvation", []client{{"a", true, 20, 0}, {"a", true, 20, 0}, {"b", false, 5, 2 * time.Second}}}
)

// outcome is what one run measured.
type outcome struct {
	swaps  int
	waits  map[string][]time.Duration // queue waits of the requests served, by profile
	failed int                        // requests not answered 200
}

// measure runs w for dur against a fresh poold whose pool has minResidency res.
func measure(ctx context.Context, bin, dir string, w workload, res, loadDelay, dur time.Duration) (outcome, error) {
	d, err := start(ctx, bin, dir, res, loadDelay)
	if err != nil {
		return outcome{}, err
	}
	defer d.stop()
	if err := d.waitReady(ctx, "a"); err != nil {
		return outcome{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range w.clients {
		wg.Go(func() { d.loop(runCtx, c) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return outcome{}, ctx.Err()
	}
	swaps, err := d.swaps()
	if err != nil {
		return outcome{}, err
	}
	d.stop() // flushes the access log
	out := outcome{swaps: swaps, waits: make(map[string][]time.Duration)}
	for _, r := range d.records() {
		if r.Status != http.StatusOK {
			out.failed++
			continue
		}
		out.waits[r.Profile] = append(out.waits[r.Profile], time.Duration(r.QueueWaitMs)*time.Millisecond)
	}
	return out, nil
}

// daemon is one running poold.
type daemon struct {
	url    string
	cmd    *exec.Cmd
	http   *http.Client
	logs   chan []record // the access log, once poold has exited
	exited chan struct{}
	once   sync.Once
}

// record is the part of an access-log line the benchmark reads.
type record struct {
	Msg         string `json:"msg"`
	Profile     string `json:"profile"`
	Status      int    `json:"status"`
	QueueWaitMs int64  `json:"queue_wait_ms"`
}

func start(ctx context.Context, bin, dir string, res, loadDelay time.Duration) (*daemon, error) {
	sim := func(id string) map[string]any {
		return map[string]any{"id": id, "command": []string{"{poold}", "engine-sim", "/models/" + id, "--port", "{port}",
			"--served-model-name", "{id}", "--sim-load-delay", loadDelay.String(), "--sim-itl", "10ms"}}
	}
	profiles, _ := json.Marshal(map[string]any{
		"pools":    []any{map[string]any{"name": "p0", "gpus": []int{0}, "default": "a", "minResidency": res.String()}},
		"defaults": map[string]any{"stopTimeout": "5s", "startupTimeout": "1m"},
		"profiles": []any{sim("a"), sim("b")},
	})
	path := filepath.Join(dir, "profiles.json")
	if err := os.WriteFile(path, profiles, 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--profiles", path, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{url: "http://" + addr, cmd: cmd, http: &http.Client{Timeout: 2 * time.Minute},
		logs: make(chan []record, 1), exited: make(chan struct{})}
	go func() {
		d.logs <- readLog(stdout)
		_ = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

func readLog(r io.Reader) []record {
	var out []record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var rec record
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "request" {
			out = append(out, rec)
		}
	}
	return out
}

// stop sends SIGTERM and waits for poold to exit (SIGKILL after a minute).
func (d *daemon) stop() {
	d.once.Do(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(time.Minute):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	})
}

// records is the access log; call it after stop.
func (d *daemon) records() []record { return <-d.logs }

// waitReady polls /status until pool p0 serves profile, for up to a minute.
func (d *daemon) waitReady(ctx context.Context, profile string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var st struct {
			Pools []struct {
				State   string  `json:"state"`
				Profile *string `json:"profile"`
			} `json:"pools"`
		}
		if resp, err := d.http.Get(d.url + "/status"); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err == nil && len(st.Pools) == 1 && st.Pools[0].State == "ready" && st.Pools[0].Profile != nil && *st.Pools[0].Profile == profile {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pool p0 not serving %q within a minute", profile)
}

// loop runs c until ctx ends; the request in flight then runs to its end.
func (d *daemon) loop(ctx context.Context, c client) {
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, c.model, c.stream, c.tokens)
	for ctx.Err() == nil {
		// Not ctx: a request sent before the end is answered, not abandoned.
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := d.http.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.think):
		}
	}
}

// swaps counts the pool's successful swaps from /metrics, the preload excluded.
func (d *daemon) swaps() (int, error) {
	resp, err := d.http.Get(d.url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		series, value, _ := strings.Cut(sc.Text(), " ")
		if !strings.HasPrefix(series, "poold_swaps_total{") || !strings.Contains(series, `result="ok"`) || strings.Contains(series, `from=""`) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", series, err)
		}
		n += int(v)
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading /metrics: %w", err)
	}
	return n, nil
}

// pct is the p-th percentile of ds (nearest rank), rounded to 10 ms, or "-".
func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(ds))
	i := max(0, (len(s)*p+99)/100-1)
	return s[i].Round(10 * time.Millisecond).String()
}
