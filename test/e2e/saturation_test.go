package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// engineStatsOf reads pool's engineStats from /status (nil when it has
// none).
func (d *daemon) engineStatsOf(pool string) *engineStats {
	d.t.Helper()
	for _, p := range d.status().Pools {
		if p.Name == pool {
			return p.EngineStats
		}
	}
	d.t.Fatalf("no pool %q in /status", pool)
	return nil
}

type engineStats struct {
	Running      int       `json:"running"`
	Waiting      int       `json:"waiting"`
	KVCacheUsage float64   `json:"kvCacheUsage"`
	SampledAt    time.Time `json:"sampledAt"`
}

// readiness is one answer of GET /ready.
type readiness struct {
	code      int
	Status    string `json:"status"`
	Saturated []struct {
		Pool, Reason, Message string
	} `json:"saturated"`
}

func (d *daemon) ready() readiness {
	d.t.Helper()
	resp, err := http.Get(d.url + "/ready")
	if err != nil {
		d.t.Fatalf("GET /ready: %v", err)
	}
	defer resp.Body.Close()
	r := readiness{code: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		d.t.Fatalf("decoding /ready: %v", err)
	}
	return r
}

// poll calls cond every 10 ms until it holds, failing the test after
// timeout; it returns how long that took.
func poll(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// An engine loaded beyond its --max-num-seqs queues the rest: poold reads
// that from the engine's own metrics into /status and its gauges, and
// /ready turns 503 (engine_waiting) until the load is gone. (The profile's
// maxInFlight, above the engine's limit, lets the engine queue: without it
// poold would take --max-num-seqs as its ceiling and queue them itself.)
func TestEngineSaturation(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--max-num-seqs", "2", "--sim-itl", "50ms"}, Extra: map[string]any{"maxInFlight": 100}}}, nil),
		"--ready-max-engine-waiting", "1")
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	poll(t, 30*time.Second, "engineStats of the idle engine", func() bool {
		st := d.engineStatsOf("p0")
		return st != nil && st.Running == 0 && st.Waiting == 0
	})
	if r := d.ready(); r.code != http.StatusOK || r.Status != "ready" {
		t.Fatalf("idle: /ready %d %+v, want 200 ready", r.code, r)
	}

	// Six long streams on an engine that runs two at a time.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 6 {
		wg.Go(func() { _, _, _, _ = d.post(ctx, "/v1/chat/completions", chatBody("m", true, 1000)) })
	}
	var last *engineStats
	took := poll(t, 30*time.Second, "engine requests waiting in /status", func() bool {
		last = d.engineStatsOf("p0")
		return last != nil && last.Waiting > 0
	})
	t.Logf("engineStats %+v seen %v after the requests were sent (the acceptance bound is 2s)", *last, took)
	if last.Running != 2 || last.Waiting != 4 {
		t.Logf("note: running %d, waiting %d while the streams arrive (2 and 4 once all have)", last.Running, last.Waiting)
	}
	poll(t, 30*time.Second, "poold_engine_requests_waiting > 0", func() bool {
		return d.metricValue(`poold_engine_requests_waiting{pool="p0",profile="m"}`) > 0
	})
	if v := d.metricValue(`poold_engine_requests_running{pool="p0",profile="m"}`); v != 2 {
		t.Errorf("poold_engine_requests_running = %v, want 2 (--max-num-seqs)", v)
	}
	if v := d.metricValue(`poold_engine_kv_cache_usage_ratio{pool="p0",profile="m"}`); v <= 0 || v > 1 {
		t.Errorf("poold_engine_kv_cache_usage_ratio = %v, want in (0, 1] with two streams running", v)
	}

	var r readiness
	poll(t, 30*time.Second, "/ready saturated", func() bool { r = d.ready(); return r.code == http.StatusServiceUnavailable })
	if r.Status != "saturated" || len(r.Saturated) != 1 || r.Saturated[0].Pool != "p0" || r.Saturated[0].Reason != "engine_waiting" {
		t.Errorf("/ready %+v, want p0 saturated by engine_waiting", r)
	}
	if resp, err := http.Get(d.url + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/health while saturated: %v %v, want 200 (liveness only)", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	cancel()
	wg.Wait()
	poll(t, 30*time.Second, "/ready back to 200", func() bool { r = d.ready(); return r.code == http.StatusOK })
	if r.Status != "ready" {
		t.Errorf("/ready %+v after the load, want ready", r)
	}
}

// The time to first token and the inter-token latency poold measures on the
// streams it passes through match the engine's configured delays.
func TestStreamTimingMatchesEngine(t *testing.T) {
	const ttft, itl, tokens, streams = 200 * time.Millisecond, 50 * time.Millisecond, 20, 5
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-ttft", ttft.String(), "--sim-itl", itl.String()}}}, nil))
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for range streams {
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", true, tokens))
		if err != nil || code != http.StatusOK {
			t.Fatalf("stream: %d %v %s", code, err, body)
		}
		checkStream(t, body, "m", tokens)
	}

	// The engine's own view, for comparison when this fails.
	_, emfs := scrape(t, d.url+"/pools/p0/metrics")
	for _, name := range []string{"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"} {
		if ms := emfs[name].GetMetric(); len(ms) == 1 {
			t.Logf("the engine's own mean %s: %.4g", name, ms[0].GetHistogram().GetSampleSum()/float64(ms[0].GetHistogram().GetSampleCount()))
		}
	}
	_, mfs := scrape(t, d.url+"/metrics")
	mean := func(name string) (float64, uint64) {
		for _, m := range mfs[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pool"] == "p0" && labels["profile"] == "m" && labels["client"] == "none" {
				h := m.GetHistogram()
				return h.GetSampleSum() / float64(h.GetSampleCount()), h.GetSampleCount()
			}
		}
		t.Fatalf("no %s{pool=p0,profile=m,client=none}", name)
		return 0, 0
	}
	within := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.1*want {
			t.Errorf("%s = %.4g, want %.4g within 10%%", what, got, want)
		} else {
			t.Logf("%s = %.4g (engine: %.4g)", what, got, want)
		}
	}
	m, n := mean("poold_time_to_first_token_seconds")
	if n != streams {
		t.Errorf("%d first tokens observed, want %d", n, streams)
	}
	within("mean time to first token (s)", m, ttft.Seconds())
	m, n = mean("poold_inter_token_latency_seconds")
	if n != streams*(tokens-1) {
		t.Errorf("%d inter-token gaps observed, want %d", n, streams*(tokens-1))
	}
	within("mean inter-token latency (s)", m, itl.Seconds())

	// The access log's per-stream figures: each stream's, and their medians.
	var ttfts, p50s []time.Duration
	poll(t, 30*time.Second, "the streams' access-log lines", func() bool {
		ttfts, p50s = nil, nil
		sc := bufio.NewScanner(strings.NewReader(d.stdout.String()))
		for sc.Scan() {
			var line struct {
				Stream   bool     `json:"stream"`
				TTFT     *float64 `json:"ttft_ms"`
				ITLP50   *float64 `json:"itl_ms_p50"`
				ITLMax   *float64 `json:"itl_ms_max"`
				Duration float64  `json:"duration_ms"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || !line.Stream {
				continue
			}
			if line.TTFT == nil || line.ITLP50 == nil || line.ITLMax == nil {
				t.Fatalf("stream's access-log line without ttft_ms, itl_ms_p50 or itl_ms_max: %s", sc.Text())
			}
			if *line.ITLMax < *line.ITLP50 || *line.TTFT > line.Duration {
				t.Errorf("inconsistent line: %s", sc.Text())
			}
			ttfts = append(ttfts, time.Duration(*line.TTFT)*time.Millisecond)
			p50s = append(p50s, time.Duration(*line.ITLP50)*time.Millisecond)
		}
		return len(ttfts) == streams
	})
	within("median access-log ttft_ms", float64(median(ttfts).Milliseconds()), float64(ttft.Milliseconds()))
	within("median access-log itl_ms_p50", float64(median(p50s).Milliseconds()), float64(itl.Milliseconds()))
}
