package e2e

// Load with swaps, and the soak (docs/reliability.md).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// loadConfig sizes one load run.
type loadConfig struct {
	clients  int
	duration time.Duration
}

// loadSize is the CI size, or the full size with POOLD_LOAD_FULL=1.
func loadSize() loadConfig {
	if os.Getenv("POOLD_LOAD_FULL") == "1" {
		return loadConfig{clients: 1000, duration: 60 * time.Second}
	}
	return loadConfig{clients: 200, duration: 10 * time.Second}
}

// raiseFileLimit lifts the test process's open-file limit to its hard limit;
// poold, started after, inherits it.
func raiseFileLimit(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < need {
		t.Skipf("open-file limit %d is under the %d this load needs", lim.Cur, need)
	}
}

// loadProfiles: three profiles on two pools, each servable on either, with a
// short residency so that shifting demand swaps.
func loadProfiles(tag string) []byte {
	extra := map[string]any{"minResidency": "300ms", "maxQueue": 4096, "maxQueueWait": "60s"}
	return profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: extra}, {Name: "p1", GPUs: []int{1}, Default: "b", Extra: extra}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-itl", "2ms", "--sim-load-delay", "50ms"}},
			{ID: "b", Flags: []string{"--sim-itl", "2ms", "--sim-load-delay", "50ms"}},
			{ID: "c", Flags: []string{"--sim-itl", "2ms", "--sim-load-delay", "50ms"}},
		}, nil)
}

// loadResult counts what the clients got.
type loadResult struct {
	mu       sync.Mutex // guards the fields below
	requests int
	byStatus map[string]int // "200", "503", or the kind of loss
	lost     []string       // the first few losses, for the report
}

func (r *loadResult) add(outcome string, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.byStatus[outcome]++
	if detail != "" && len(r.lost) < 5 {
		r.lost = append(r.lost, detail)
	}
}

// runClients runs n closed-loop streaming clients against d for dur; each
// request picks a profile with a demand that shifts over time (so pools swap),
// and every answer must be a complete stream or a clear 503.
func runClients(d *daemon, n int, dur time.Duration) *loadResult {
	res := &loadResult{byStatus: map[string]int{}}
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for ctx.Err() == nil {
				// The favourite profile rotates every 2 s; a third of requests
				// go elsewhere.
				fav := int(time.Since(start)/(2*time.Second)) % 3
				if rng.IntN(3) == 0 {
					fav = rng.IntN(3)
				}
				model := string(rune('a' + fav))
				outcome, detail := loadRequest(client, d.url, model, 4+rng.IntN(8))
				res.add(outcome, detail)
				if outcome == "503" {
					// A clear refusal: back off as a client would.
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		})
	}
	wg.Wait()
	return res
}

// loadRequest sends one streaming chat and classifies the answer: "200" (a
// complete stream), "503" (an OpenAI error with Retry-After), or a loss.
func loadRequest(client *http.Client, base, model string, tokens int) (outcome, detail string) {
	// A generous bound: a request waits at most for its queue (maxQueueWait).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody(model, true, tokens)))
	resp, err := client.Do(req)
	if err != nil {
		return "lost: transport", err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return "lost: cut", fmt.Sprintf("%d %v", resp.StatusCode, err)
	case resp.StatusCode == http.StatusOK:
		ev := sseEvents(body)
		if len(ev) != tokens+2 || ev[len(ev)-1] != "[DONE]" {
			return "lost: incomplete stream", string(body)
		}
		return "200", ""
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" && strings.Contains(string(body), `"error"`):
		return "503", ""
	default:
		return "lost: " + strconv.Itoa(resp.StatusCode), string(body)
	}
}

// metricsOf reads the unlabelled samples and the sums of labelled series of
// the named metrics from d's /metrics.
func metricsOf(t *testing.T, d *daemon, names ...string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(scrapeText(t, d)))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if !slices.Contains(names, name) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[name] += v
	}
	return out
}

// queueWaitP99 estimates the 99th percentile of poold_queue_wait_seconds (all
// pools and models) as the upper bound of the bucket that holds it.
func queueWaitP99(t *testing.T, d *daemon) float64 {
	t.Helper()
	buckets := map[float64]float64{}
	for line := range strings.Lines(scrapeText(t, d)) {
		if !strings.HasPrefix(line, "poold_queue_wait_seconds_bucket{") {
			continue
		}
		i := strings.Index(line, `le="`)
		le, _, _ := strings.Cut(line[i+4:], `"`)
		ub, _ := strconv.ParseFloat(le, 64)
		v, _ := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:]), 64)
		buckets[ub] += v
	}
	bounds := slices.Sorted(func(yield func(float64) bool) {
		for b := range buckets {
			if !yield(b) {
				return
			}
		}
	})
	if len(bounds) == 0 {
		return 0
	}
	total := buckets[math.Inf(1)]
	for _, b := range bounds {
		if buckets[b] >= 0.99*total {
			return b
		}
	}
	return math.Inf(1)
}

// settle waits until no pool has a request in flight or waiting.
func settle(t *testing.T, d *daemon) {
	t.Helper()
	for _, name := range []string{"p0", "p1"} {
		d.waitPool(name, 30*time.Second, "no lease left", func(p poolView) bool { return p.InFlight == 0 && len(p.Waiting) == 0 })
	}
}

// TestLoadWithSwaps: many streaming clients over three profiles on two pools,
// with demand shifting so that the pools swap: no request is lost (each
// completes or gets a clear 503), no lease leaks, and goroutines and memory
// come back down. 200 clients for 10 s; 1000 for 60 s with POOLD_LOAD_FULL=1.
func TestLoadWithSwaps(t *testing.T) {
	size := loadSize()
	// Per client: its connection to poold, poold's side of it, poold's
	// connection to an engine and the engine's side.
	raiseFileLimit(t, uint64(4*size.clients+256))
	tag := t.Name()
	d := startPoold(t, tag, loadProfiles(tag), "--access-log", os.DevNull, "--log-level", "warn")
	settle(t, d)
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	// A short warm-up at full concurrency sizes the connection pools, so that
	// the baseline includes them.
	runClients(d, size.clients, time.Second)
	settle(t, d)
	base := metricsOf(t, d, "go_goroutines", "process_open_fds", "poold_swaps_total")

	res := runClients(d, size.clients, size.duration)
	settle(t, d)
	after := metricsOf(t, d, "go_goroutines", "process_open_fds", "poold_swaps_total", "go_memstats_heap_inuse_bytes")
	pid := d.cmd.Process.Pid
	t.Logf("load: %d clients for %s: %d requests; by status %v; swaps %v; p99 queue wait <= %gs; poold peak RSS %d MiB, RSS after %d MiB; goroutines %v -> %v; open fds %v -> %v",
		size.clients, size.duration, res.requests, res.byStatus, after["poold_swaps_total"]-base["poold_swaps_total"],
		queueWaitP99(t, d), procMemory(t, pid, "VmHWM")>>20, procMemory(t, pid, "VmRSS")>>20,
		base["go_goroutines"], after["go_goroutines"], base["process_open_fds"], after["process_open_fds"])

	for outcome := range res.byStatus {
		if outcome != "200" && outcome != "503" {
			t.Errorf("lost requests: %v; first ones: %q", res.byStatus, res.lost)
			break
		}
	}
	if res.byStatus["200"] == 0 || after["poold_swaps_total"] == base["poold_swaps_total"] {
		t.Errorf("the load did not exercise serving and swapping: %v, swaps %v", res.byStatus, after["poold_swaps_total"]-base["poold_swaps_total"])
	}
	// A leak of one goroutine or fd per request would show: there were far
	// more requests than this slack (the connections of the warm-up's size).
	slack := float64(4*size.clients + 100)
	if after["go_goroutines"] > base["go_goroutines"]+slack || after["process_open_fds"] > base["process_open_fds"]+slack {
		t.Errorf("goroutines %v -> %v, fds %v -> %v after %d requests", base["go_goroutines"], after["go_goroutines"], base["process_open_fds"], after["process_open_fds"], res.requests)
	}
	if heap := after["go_memstats_heap_inuse_bytes"]; heap > 512<<20 {
		t.Errorf("heap in use after the run: %d MiB", int64(heap)>>20)
	}
}

// TestSoak runs moderate load with swaps for 10 minutes (POOLD_SOAK=1; it is
// skipped otherwise) and checks that goroutines, open fds and heap do not
// grow: the last minute's samples against the second minute's.
func TestSoak(t *testing.T) {
	if os.Getenv("POOLD_SOAK") != "1" {
		t.Skip("set POOLD_SOAK=1 to run the 10-minute soak")
	}
	const clients, rounds, round = 100, 10, time.Minute
	raiseFileLimit(t, 4*clients+256)
	tag := t.Name()
	d := startPoold(t, tag, loadProfiles(tag), "--access-log", os.DevNull, "--log-level", "warn")
	settle(t, d)
	names := []string{"go_goroutines", "process_open_fds", "go_memstats_heap_inuse_bytes"}
	var samples []map[string]float64
	total := &loadResult{byStatus: map[string]int{}}
	for i := range rounds {
		res := runClients(d, clients, round)
		settle(t, d)
		total.requests += res.requests
		for k, v := range res.byStatus {
			total.byStatus[k] += v
		}
		s := metricsOf(t, d, names...)
		samples = append(samples, s)
		t.Logf("soak round %d: %d requests %v; goroutines %v, fds %v, heap %d MiB, RSS %d MiB",
			i+1, res.requests, res.byStatus, s["go_goroutines"], s["process_open_fds"], int64(s["go_memstats_heap_inuse_bytes"])>>20, procMemory(t, d.cmd.Process.Pid, "VmRSS")>>20)
	}
	for outcome := range total.byStatus {
		if outcome != "200" && outcome != "503" {
			t.Errorf("lost requests over the soak: %v", total.byStatus)
		}
	}
	first, last := samples[1], samples[len(samples)-1]
	// Goroutines and fds follow the keep-alive connections left idle (from the
	// clients, and to each engine alive, up to one per client), which come and
	// go with the swaps; a leak instead grows with the ~6×10^4 requests of each
	// round. Heap is bounded relative to round 2.
	slack := map[string]float64{"go_goroutines": 4 * clients, "process_open_fds": 2 * clients}
	for _, name := range names {
		limit := first[name]*1.25 + 50 + slack[name]
		if last[name] > limit {
			t.Errorf("%s grew from %v (round 2) to %v (round %d)", name, first[name], last[name], rounds)
		}
	}
}
