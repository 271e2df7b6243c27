package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/statusapi"
)

// An ejection lasts at least base; one soon after a re-admission, or after a
// failed trial, doubles, up to the maximum; one long after starts again at
// base.
func TestEjectionLength(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var e ejection
	steps := []struct {
		at     time.Duration
		again  bool
		want   time.Duration
		readmt bool
	}{
		{0, false, time.Second, true},                   // first: base
		{2 * time.Second, false, 2 * time.Second, true}, // soon after: doubled
		{5 * time.Second, true, 4 * time.Second, false}, // failed trial: doubled at once
		{10 * time.Second, true, 4 * time.Second, true}, // capped
		{time.Minute, false, time.Second, false},        // long after: base again
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		e.eject(now, time.Second, 4*time.Second, "errors", s.again)
		if e.length != s.want || !e.until.Equal(now.Add(s.want)) || e.over(now) || !e.over(now.Add(s.want)) {
			t.Fatalf("step %d: length %s until %s; want %s", i, e.length, e.until, s.want)
		}
		if s.readmt {
			e.readmit(now.Add(s.want))
		}
	}
}

// The success ratio counts the answers of the last 15 to 30 s; a model on a
// host is degraded below minSuccess with at least minAnswers answers, and
// ejected after ejectAfter failures in a row.
func TestModelHealth(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m := &modelHealth{halfStart: t0}
	record := func(o outcome, at time.Duration) bool {
		return m.record(o, false, t0.Add(at), 3, time.Second, time.Minute)
	}
	for i := range 7 {
		record(success, time.Duration(i)*time.Millisecond)
	}
	record(failure, 10*time.Millisecond)
	record(failure, 11*time.Millisecond)
	if h, ok := m.health(t0.Add(time.Second)); !ok || h != Degraded {
		t.Fatalf("7 of 9: %v %v, want degraded", h, ok)
	}
	// 31 s later every answer has aged out.
	if h, ok := m.health(t0.Add(31 * time.Second)); !ok || h != Healthy {
		t.Fatalf("after the window: %v %v, want healthy", h, ok)
	}
	later := 40 * time.Second
	record(success, later-time.Second) // ends the failures in a row
	first, second, third := record(failure, later), record(failure, later), record(failure, later)
	if first || second || !third {
		t.Fatal("three failures in a row did not eject, or fewer did")
	}
	if _, ok := m.health(t0.Add(later + 999*time.Millisecond)); ok {
		t.Fatal("routable during its ejection")
	}
	if h, ok := m.health(t0.Add(later + time.Second)); !ok || h != Trial {
		t.Fatalf("after its ejection: %v %v, want trial", h, ok)
	}
	m.trialBusy = true
	if _, ok := m.health(t0.Add(later + time.Second)); ok {
		t.Fatal("routable while its trial is in flight")
	}
	if m.record(success, true, t0.Add(later+2*time.Second), 3, time.Second, time.Minute) {
		t.Fatal("a successful trial ejected")
	}
	if h, ok := m.health(t0.Add(later + 2*time.Second)); !ok || h != Healthy || m.trialBusy {
		t.Fatalf("after a successful trial: %v %v", h, ok)
	}
}

// A host answering 500 for one model is ejected for that model only, stays
// out for at least the ejection's length, and comes back through one trial
// request whose success re-admits it; its other model is served meanwhile.
func TestModelEjectedOnOneHost(t *testing.T) {
	var mu sync.Mutex // guards now
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	var failing sync.Mutex // held while bad fails qwen
	failQwen := true
	bad := newFakeHost(t, "bad", []statusapi.Pool{readyPool("gpu0", "qwen", 0), readyPool("gpu1", "llama", 0)}, model("qwen", "qwen"), model("llama", "llama"))
	good := newFakeHost(t, "good", []statusapi.Pool{readyPool("gpu0", "qwen", 3)}, model("qwen", "qwen"))
	bad.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			failing.Lock()
			fail := failQwen && strings.Contains(string(b), "qwen")
			failing.Unlock()
			if fail {
				http.Error(w, "engine failed", http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, `{"ok":"bad"}`)
		}
	})
	tf := startFleet(t, Options{EjectAfter: 2, PollInterval: time.Hour, MaxBackoff: 10 * time.Second, Now: clock}, HandlerOptions{}, bad, good)
	hosts := func(n int, body string) map[string]int {
		out := map[string]int{}
		for range n {
			resp, _ := tf.post(body)
			out[resp.Header.Get("X-Fleet-Host")+"/"+fmt.Sprint(resp.StatusCode)]++
		}
		return out
	}
	got := hosts(6, `{"model": "qwen"}`)
	if got["bad/500"] != 2 || got["good/200"] != 4 {
		t.Fatalf("qwen: %v; want 2 failures on bad, then good", got)
	}
	if v := testutil.ToFloat64(tf.fleet.metrics.ejections.WithLabelValues("bad", "errors")); v != 1 {
		t.Fatalf("ejections = %v", v)
	}
	if got := hosts(2, `{"model": "llama"}`); got["bad/200"] != 2 {
		t.Fatalf("llama on the host that fails qwen: %v", got)
	}
	// The poll interval (an hour here) is the ejection's floor... capped by
	// MaxBackoff: 10 s. A trial after it fails: the next lasts 20 s → 10 s cap.
	advance(10 * time.Second)
	if got := hosts(2, `{"model": "qwen"}`); got["bad/500"] != 1 || got["good/200"] != 1 {
		t.Fatalf("after the ejection: %v; want one trial on bad", got)
	}
	failing.Lock()
	failQwen = false
	failing.Unlock()
	advance(9 * time.Second)
	if got := hosts(1, `{"model": "qwen"}`); got["good/200"] != 1 {
		t.Fatalf("during the second ejection: %v", got)
	}
	advance(time.Second)
	if got := hosts(1, `{"model": "qwen"}`); got["bad/200"] != 1 {
		t.Fatalf("the second trial: %v", got)
	}
	st := tf.waitHost("bad", "qwen healthy", func(s statusapi.Host) bool { return len(s.Models) == 1 && s.Models[0].Health == "healthy" })
	if !st.Healthy || st.Models[0].Model != "qwen" {
		t.Fatalf("bad: %+v", st)
	}
}

// A removed host's series stay until the requests in flight to it are
// counted, so that fleetd_requests_total does not lose them.
func TestRemovedHostSeriesKeptInFlight(t *testing.T) {
	release := make(chan struct{})
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{}, h)
	resp, _ := tf.post(`{"model": "qwen"}`) // a first request, so that the host has a series
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\n")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "data: [DONE]\n\n")
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, tf.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model": "qwen", "stream": true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the stream in flight", func() bool { return h.postCount() == 2 })
	tf.fleet.Apply(&File{}) // the host leaves the fleet
	series := func() int { return testutil.CollectAndCount(tf.fleet.metrics.requests) }
	if n := series(); n != 1 {
		t.Fatalf("%d request series after the removal, want the host's 1 kept", n)
	}
	close(release)
	<-done
	waitFor(t, "the series dropped", func() bool { return series() == 0 })
}

// Concurrent first requests for a model awake nowhere, with every pool
// busy, all go to the one host the first of them claimed.
func TestColdBurstClaimsOneHost(t *testing.T) {
	var fakes []*fakeHost
	for i := range 3 {
		fh := newFakeHost(t, fmt.Sprintf("h%d", i), []statusapi.Pool{readyPool("gpu0", "other", 2)}, model("cold", "cold"), model("other", "other"))
		fh.set(func(fh *fakeHost) {
			fh.post = func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(50 * time.Millisecond) // queued for the load
				fmt.Fprintf(w, `{"ok":%q}`, fh.name)
			}
		})
		fakes = append(fakes, fh)
	}
	tf := startFleet(t, Options{PollInterval: time.Hour}, HandlerOptions{}, fakes...)
	var mu sync.Mutex // guards by
	by := map[string]int{}
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			resp, _ := tf.post(fmt.Sprintf(`{"model": "cold", "messages": [{"role": "user", "content": "%d"}]}`, i))
			mu.Lock()
			by[resp.Header.Get("X-Fleet-Host")]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(by) != 1 {
		t.Fatalf("a cold burst went to %v, want one host", by)
	}
}

// sharedClaims stands in for the replicas' Redis: the first claim of a key
// wins for good.
type sharedClaims struct {
	mu     sync.Mutex // guards claims
	claims map[string]string
	calls  int
}

func (s *sharedClaims) Claim(ctx context.Context, key, host string, lease time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if w, ok := s.claims[key]; ok {
		return w, nil
	}
	s.claims[key] = host
	return host, nil
}

// A new copy claimed by another replica is followed: every request of a cold
// burst goes to the winner, and the shared store is asked once.
func TestSharedClaimFollowsWinner(t *testing.T) {
	var fakes []*fakeHost
	for i := range 3 {
		fakes = append(fakes, newFakeHost(t, fmt.Sprintf("h%d", i), []statusapi.Pool{readyPool("gpu0", "other", 2)}, model("cold", "cold")))
	}
	shared := &sharedClaims{claims: map[string]string{"copy:cold": "h2"}} // another replica's claim
	tf := startFleet(t, Options{PollInterval: time.Hour}, HandlerOptions{Claims: shared}, fakes...)
	for i := range 10 {
		resp, _ := tf.post(fmt.Sprintf(`{"model": "cold", "messages": [{"role": "user", "content": "%d"}]}`, i))
		if h := resp.Header.Get("X-Fleet-Host"); h != "h2" {
			t.Fatalf("request %d went to %s, not the claimed h2", i, h)
		}
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.calls != 1 {
		t.Fatalf("the shared store was asked %d times, want once (then the local copy of the claim)", shared.calls)
	}
}

// After a scale-out, the same fleetd does not scale the model out again
// within its cool-down, even if every copy is still saturated.
func TestScaleOutCooldown(t *testing.T) {
	slow := newFakeHost(t, "slow", []statusapi.Pool{saturatedPool("gpu0", "m")}, model("m", "m"))
	spare1 := newFakeHost(t, "spare1", []statusapi.Pool{emptyPool("gpu0")}, model("m", "m"))
	spare2 := newFakeHost(t, "spare2", []statusapi.Pool{emptyPool("gpu0")}, model("m", "m"))
	tf := startFleet(t, Options{PollInterval: time.Hour, EngineStatsMaxAge: time.Hour}, HandlerOptions{ScaleOut: true, ScaleOutCooldown: time.Hour, ClaimLease: time.Nanosecond}, slow, spare1, spare2)
	resp, _ := tf.post(`{"model": "m"}`)
	first := resp.Header.Get("X-Fleet-Host")
	if first == "slow" || tf.handler.scaledOut.held("m", time.Now()) == "" {
		t.Fatalf("no scale-out: %s", first)
	}
	// The copy's host is polled only in an hour: it still looks empty, and
	// the claim's lease is over; only the cool-down stops a second copy.
	for range 5 {
		resp, _ = tf.post(`{"model": "m"}`)
		if h := resp.Header.Get("X-Fleet-Host"); h != "slow" && h != first {
			t.Fatalf("a second scale-out, to %s, within the cool-down", h)
		}
	}
}
