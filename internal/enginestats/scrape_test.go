package enginestats

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// fakeEngine serves vLLM-like metrics whose values a test sets.
type fakeEngine struct {
	srv               *httptest.Server
	mu                sync.Mutex // guards the fields below
	running, waiting  int
	kv, queries, hits float64
	sleepLevel        int           // vllm:engine_sleep_state's level; 0: awake
	status            int           // 0: 200
	hang              chan struct{} // non-nil: requests wait for it (or their end)
}

func newFakeEngine(t *testing.T) *fakeEngine {
	e := &fakeEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		hang, status := e.hang, e.status
		body := fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} %g\n"+
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %g\n"+
			"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} %g\n",
			e.running, e.waiting, e.kv, e.queries, e.hits)
		b := func(ok bool) int {
			if ok {
				return 1
			}
			return 0
		}
		body += "# TYPE vllm:engine_sleep_state gauge\n"
		for _, s := range []struct {
			state string
			on    bool
		}{{"awake", e.sleepLevel == 0}, {"weights_offloaded", e.sleepLevel == 1}, {"discard_all", e.sleepLevel == 2}} {
			body += fmt.Sprintf("vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=%q} %d\n", s.state, b(s.on))
		}
		e.mu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		if status != 0 {
			http.Error(w, "no", status)
			return
		}
		fmt.Fprint(w, body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) set(f func(e *fakeEngine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *fakeEngine) port(t *testing.T) int {
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readyPool is pool name with a ready engine on port (pid 1).
func readyPool(name string, port int) statusapi.Pool {
	ready := time.Now()
	return statusapi.Pool{Name: name, State: statusapi.StateReady, Engine: &statusapi.Engine{PID: 1, Port: port, ReadyAt: &ready}}
}

// fill returns the engine stats Fill gives pool p.
func fill(s *Scraper, p statusapi.Pool) *statusapi.EngineStats {
	ps := []statusapi.Pool{p}
	s.Fill(ps)
	return ps[0].EngineStats
}

func TestScraperSamplesAwakeEngines(t *testing.T) {
	e := newFakeEngine(t)
	e.set(func(e *fakeEngine) { e.running, e.waiting, e.kv, e.queries, e.hits = 4, 2, 0.5, 100, 25 })
	gpu0 := readyPool("gpu0", e.port(t))
	loading := statusapi.Pool{Name: "gpu1", State: statusapi.StateStarting, Engine: &statusapi.Engine{PID: 2, Port: e.port(t)}}
	var failed atomic.Int32
	s := New(Options{Interval: time.Second, Pools: func() []statusapi.Pool { return []statusapi.Pool{gpu0, loading} }, Failed: func(string) { failed.Add(1) }})

	s.scrapeAll(context.Background())
	st := fill(s, gpu0)
	if st == nil || st.Running != 4 || st.Waiting != 2 || st.KVCacheUsage != 0.5 || st.PrefixCacheHitRate == nil || *st.PrefixCacheHitRate != 0.25 {
		t.Fatalf("engine stats = %+v, want running 4, waiting 2, KV 0.5, hit rate 0.25 (since the engine started)", st)
	}
	if time.Since(st.SampledAt) > time.Minute {
		t.Errorf("sampledAt %v is not the scrape's time", st.SampledAt)
	}
	if got := fill(s, loading); got != nil {
		t.Errorf("an engine still loading has stats %+v; want none (it is not scraped)", got)
	}
	if failed.Load() != 0 {
		t.Errorf("%d failures counted, want 0", failed.Load())
	}

	// The hit rate is over the recent scrapes: 100 queries since, all hits.
	e.set(func(e *fakeEngine) { e.queries, e.hits = 200, 125 })
	s.scrapeAll(context.Background())
	if st := fill(s, gpu0); st == nil || *st.PrefixCacheHitRate != 125.0/200 {
		t.Fatalf("engine stats = %+v, want hit rate %v over the window", st, 125.0/200)
	}
	for range prefixWindow {
		s.scrapeAll(context.Background())
	}
	if st := fill(s, gpu0); st == nil || st.PrefixCacheHitRate != nil {
		t.Errorf("no query within the window: hit rate = %v, want nil", st.PrefixCacheHitRate)
	}
	e.set(func(e *fakeEngine) { e.queries, e.hits = 300, 200 })
	s.scrapeAll(context.Background())
	if st := fill(s, gpu0); st == nil || st.PrefixCacheHitRate == nil || *st.PrefixCacheHitRate != 0.75 {
		t.Errorf("hit rate = %v, want 0.75 (75 of the last 100)", st.PrefixCacheHitRate)
	}
	// Counters that go back (an engine that restarted): the window starts again.
	e.set(func(e *fakeEngine) { e.queries, e.hits = 10, 1 })
	s.scrapeAll(context.Background())
	if st := fill(s, gpu0); st == nil || st.PrefixCacheHitRate == nil || *st.PrefixCacheHitRate != 0.1 {
		t.Errorf("after a counter reset: hit rate = %v, want 0.1", st.PrefixCacheHitRate)
	}
}

func TestScraperDropsSamplesOfOtherEngines(t *testing.T) {
	e := newFakeEngine(t)
	gpu0 := readyPool("gpu0", e.port(t))
	pools := []statusapi.Pool{gpu0}
	var mu sync.Mutex
	s := New(Options{Interval: time.Second, Pools: func() []statusapi.Pool { mu.Lock(); defer mu.Unlock(); return pools }})
	s.scrapeAll(context.Background())
	if fill(s, gpu0) == nil {
		t.Fatal("no stats after a scrape")
	}
	// Another engine in the pool since: the sample is not its.
	swapped := readyPool("gpu0", e.port(t))
	swapped.Engine.PID = 99
	if st := fill(s, swapped); st != nil {
		t.Errorf("a new engine shows the old one's stats %+v", st)
	}
	// The pool runs no engine: its state is forgotten at the next round.
	mu.Lock()
	pools = []statusapi.Pool{{Name: "gpu0", State: statusapi.StateEmpty}}
	mu.Unlock()
	s.scrapeAll(context.Background())
	if len(s.pools) != 0 {
		t.Errorf("states kept for pools without an engine: %v", s.pools)
	}
	// A sample too old is stale.
	s.record(target{"gpu0", 1, e.port(t)}, Stats{Running: 1}, nil, time.Now().Add(-time.Hour))
	if st := fill(s, gpu0); st != nil {
		t.Errorf("an hour-old sample is shown: %+v", st)
	}
}

func TestScraperCountsFailures(t *testing.T) {
	e := newFakeEngine(t)
	e.set(func(e *fakeEngine) { e.running = 3 })
	gpu0 := readyPool("gpu0", e.port(t))
	var failed atomic.Int32
	s := New(Options{Interval: time.Second, Timeout: 100 * time.Millisecond, Pools: func() []statusapi.Pool { return []statusapi.Pool{gpu0} },
		Failed: func(pool string) {
			if pool == "gpu0" {
				failed.Add(1)
			}
		}})

	e.set(func(e *fakeEngine) { e.status = http.StatusInternalServerError })
	s.scrapeAll(context.Background())
	if failed.Load() != 1 || fill(s, gpu0) != nil {
		t.Fatalf("after a 500: %d failures, stats %+v; want 1 and none", failed.Load(), fill(s, gpu0))
	}

	// A hung engine fails by the timeout.
	hang := make(chan struct{})
	defer close(hang)
	e.set(func(e *fakeEngine) { e.status, e.hang = 0, hang })
	done := make(chan struct{})
	go func() {
		s.scrapeAll(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a scrape of a hung engine did not end by its timeout")
	}
	if failed.Load() != 2 {
		t.Errorf("%d failures after a hung scrape, want 2", failed.Load())
	}

	e.set(func(e *fakeEngine) { e.hang = nil })
	s.scrapeAll(context.Background())
	if st := fill(s, gpu0); st == nil || st.Running != 3 || failed.Load() != 2 {
		t.Errorf("after recovering: stats %+v, %d failures; want running 3 and still 2", st, failed.Load())
	}
}

func TestScraperRuns(t *testing.T) {
	e := newFakeEngine(t)
	e.set(func(e *fakeEngine) { e.waiting = 7 })
	gpu0 := readyPool("gpu0", e.port(t))
	s := New(Options{Interval: 10 * time.Millisecond, Pools: func() []statusapi.Pool { return []statusapi.Pool{gpu0} }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.Run(ctx)
		close(done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for st := fill(s, gpu0); st == nil || st.Waiting != 7; st = fill(s, gpu0) {
		if time.Now().After(deadline) {
			t.Fatal("no sample within 30s of Run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestScraperTellsOfSleepingEngines(t *testing.T) {
	e := newFakeEngine(t)
	gpu0 := readyPool("gpu0", e.port(t))
	var mu sync.Mutex
	var calls []string
	s := New(Options{Interval: time.Second, Pools: func() []statusapi.Pool { return []statusapi.Pool{gpu0} },
		Asleep: func(pool string, pid, port, level int) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, fmt.Sprintf("%s pid %d port %d level %d", pool, pid, port, level))
		}})
	told := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}

	s.scrapeAll(context.Background())
	if got := told(); len(got) != 0 {
		t.Fatalf("an awake engine was told asleep: %v", got)
	}
	if st := fill(s, gpu0); st == nil || st.SleepLevel != 0 {
		t.Fatalf("awake engine's stats = %+v, want sleep level 0", st)
	}
	for _, level := range []int{1, 2} {
		e.set(func(e *fakeEngine) { e.sleepLevel = level })
		s.scrapeAll(context.Background())
		want := fmt.Sprintf("gpu0 pid 1 port %d level %d", e.port(t), level)
		if got := told(); len(got) == 0 || got[len(got)-1] != want {
			t.Fatalf("engine asleep at level %d: told %v, want last %q", level, got, want)
		}
		if st := fill(s, gpu0); st == nil || st.SleepLevel != level {
			t.Errorf("engine asleep at level %d: stats %+v", level, st)
		}
	}
	// Every sample that says so tells it: the pool decides what is news.
	s.scrapeAll(context.Background())
	if got := told(); len(got) != 3 {
		t.Errorf("told %v, want once per sample asleep (3)", got)
	}
	e.set(func(e *fakeEngine) { e.sleepLevel = 0 })
	s.scrapeAll(context.Background())
	if got := told(); len(got) != 3 {
		t.Errorf("an engine awake again was told asleep: %v", got)
	}
}
