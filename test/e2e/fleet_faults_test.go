package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb/rdbtest"
)

// metricSum adds up the samples of metric name at base/metrics whose labels
// contain every one of match (such as `result="ok"`).
func metricSum(t *testing.T, base, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(series, name+"{") && series != name {
			continue
		}
		if !slices.ContainsFunc(match, func(m string) bool { return !strings.Contains(series, m) }) {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			sum += v
		}
	}
	return sum
}

// hostsWithA starts n poolds (named after the test, -1, -2, …), each with
// one pool preloading model a (hostProfiles), host i's engine with the
// extra simulator flags flags(i) (flags may be nil), and waits until a is
// ready everywhere.
func hostsWithA(t *testing.T, n int, flags func(i int) []string) []*daemon {
	t.Helper()
	var hosts []*daemon
	for i := range n {
		tag := fmt.Sprintf("%s-%d", t.Name(), i+1)
		var extra []string
		if flags != nil {
			extra = flags(i)
		}
		hosts = append(hosts, startPoold(t, tag, hostProfiles(tag, "a", []string{"a"}, extra...)))
	}
	for _, h := range hosts {
		h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	}
	return hosts
}

// starts is the number of engines the hosts started, fleet-wide.
func starts(t *testing.T, hosts []*daemon) float64 {
	n := 0.0
	for _, h := range hosts {
		n += metricSum(t, h.url, "poold_engine_starts_total", `result="ok"`)
	}
	return n
}

// A host whose engine answers every request for one model with 500 does not
// win by failing fast: it is ejected for that model after a few failures
// and tried again only by one request per ejection, which doubles, while it
// still serves its other model.
func TestFleetFailingHost(t *testing.T) {
	hosts := hostsWithA(t, 2, nil)
	tag := t.Name() + "-3"
	sims := []sim{
		{ID: "a", Pools: []string{"gpu0"}, Flags: []string{"--sim-fail-requests"}},
		{ID: "b", Pools: []string{"gpu1"}, Flags: []string{"--sim-itl", "20ms"}},
	}
	hosts = append(hosts, startPoold(t, tag, profilesJSON(tag, []pool{{Name: "gpu0", GPUs: []int{0}, Default: "a"}, {Name: "gpu1", GPUs: []int{1}, Default: "b"}}, sims, nil)))
	for _, p := range []string{"gpu0", "gpu1"} {
		hosts[2].waitPool(p, 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	}
	f := startFleetd(t, hosts, "--max-backoff", "10s", "--scale-out=false")

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const total, clients = 300, 10
	var mu sync.Mutex // guards byHost, codes
	byHost := map[string]int{}
	codes := map[int]int{}
	next := make(chan int, total)
	for i := range total {
		next <- i
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for i := range next {
				code, host, _, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "request %d"}]}`, i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				byHost[host]++
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	ok := codes[http.StatusOK]
	t.Logf("%d requests in %s: %d succeeded (%.1f%%); answers by host %v; statuses %v", total, took.Round(time.Millisecond), ok, 100*float64(ok)/total, byHost, codes)
	if ok < total*95/100 {
		t.Errorf("%d of %d succeeded, want at least 95%%", ok, total)
	}
	// host3 got its first failures, then one trial per ejection, each
	// ejection at least twice the last.
	if n := byHost["host3"]; n > 12 {
		t.Errorf("the failing host answered %d requests", n)
	}
	if v := metricSum(t, f.url, "fleetd_host_ejections_total", `host="host3"`, `cause="errors"`); v < 1 {
		t.Errorf("fleetd_host_ejections_total{host3,errors} = %v", v)
	}
	h3 := f.hosts()["host3"]
	i := slices.IndexFunc(h3.Models, func(m struct {
		Model  string `json:"model"`
		Health string `json:"health"`
	}) bool {
		return m.Model == "a"
	})
	if i < 0 || h3.Models[i].Health == "healthy" || !h3.Healthy {
		t.Errorf("host3 in /status: %+v; want healthy, with model a ejected or on trial", h3)
	} else {
		t.Logf("host3: model a %s", h3.Models[i].Health)
	}
	// The host still serves its other model.
	for range 5 {
		if code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "b")); err != nil || code != http.StatusOK || host != "host3" {
			t.Fatalf("b: %d from %q: %s %v", code, host, body, err)
		}
	}
	if strings.Contains(f.stderr.String(), `"model re-admitted on host"`) {
		t.Error("the failing model was re-admitted")
	}
}

// A host that refuses the client's key (401) is not counted as failing, and
// the key's next requests go to hosts that accept it; a 401 started
// nothing, so the request is tried on the next host at once.
func TestFleetKeyRefused(t *testing.T) {
	dir := t.TempDir()
	hostKeys := dir + "/keys"
	writeFile(t, hostKeys, []byte("sk-host-only\n"))
	hostKey := dir + "/host-key"
	writeFile(t, hostKey, []byte("sk-host-only\n"))
	var hosts []*daemon
	for i := range 3 {
		tag := fmt.Sprintf("%s-%d", t.Name(), i+1)
		var args []string
		if i == 0 {
			args = []string{"--api-keys-file", hostKeys}
		}
		hosts = append(hosts, startPoold(t, tag, hostProfiles(tag, "a", []string{"a"}), args...))
	}
	for _, h := range hosts {
		h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	}
	f := startFleetd(t, hosts, "--host-api-key-file", hostKey)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	byHost, ok := map[string]int{}, 0
	for i := range 60 {
		code, host, body, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "r%d"}]}`, i),
			"Authorization", "Bearer sk-client")
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusOK {
			ok++
		} else {
			t.Logf("request %d: %d from %s: %s", i, code, host, body)
		}
		byHost[host]++
	}
	refusedAt1 := metricSum(t, f.url, "fleetd_retries_total", `host="host1"`, `cause="key"`)
	t.Logf("60 requests with a key host1 refuses: %d succeeded; answers by host %v; host1 refused %v", ok, byHost, refusedAt1)
	if ok != 60 || byHost["host1"] != 0 {
		t.Errorf("%d of 60 succeeded, %d answered by host1", ok, byHost["host1"])
	}
	if refusedAt1 > 2 {
		t.Errorf("host1 was asked %v times for a key it refuses", refusedAt1)
	}
	if h := f.hosts()["host1"]; !h.Healthy || len(h.Models) != 0 {
		t.Errorf("host1 counted as failing: %+v", h)
	}
}

// busyFleet is three hosts with model a awake on each, every pool busy with
// streams of a, and a model d awake nowhere (minResidency 1s, so that a
// pool may swap once its streams end).
func busyFleet(t *testing.T) []*daemon {
	var hosts []*daemon
	for i := range 3 {
		tag := fmt.Sprintf("%s-%d", t.Name(), i+1)
		var sims []sim
		for _, m := range []string{"a", "d"} {
			sims = append(sims, sim{ID: m, Flags: []string{"--sim-load-delay", "1s", "--sim-itl", "20ms"}})
		}
		p := profilesJSON(tag, []pool{{Name: "gpu0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "1s"}}}, sims, nil)
		hosts = append(hosts, startPoold(t, tag, p))
	}
	for _, h := range hosts {
		h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	}
	return hosts
}

// coldBurst keeps every pool of hosts busy with two streams of a (about 3 s
// each, through fleetd fs[0]), then sends n concurrent requests for d, awake
// nowhere, each with its own content (so its own affinity key), through the
// fleetds in turn. It returns the engines started fleet-wide meanwhile and
// the answers by host.
func coldBurst(t *testing.T, hosts []*daemon, fs []*fleetd, n int) (float64, map[string]int) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for _, f := range fs {
		for i := range hosts {
			f.waitHost(fmt.Sprintf("host%d", i+1), 10*time.Second, "a ready", func(h fleetHost) bool { return len(h.Pools) == 1 && h.Pools[0].State == "ready" })
		}
	}
	before := starts(t, hosts)
	var streams sync.WaitGroup
	for i := range 2 * len(hosts) {
		resp, rd := fs[0].openStream(ctx, "a", 150, "X-Session-Id", fmt.Sprintf("busy-%d", i))
		streams.Go(func() {
			defer resp.Body.Close()
			for {
				if _, err := rd.ReadString('\n'); err != nil {
					return
				}
			}
		})
	}
	for _, h := range hosts {
		h.waitPool("gpu0", 10*time.Second, "busy", func(p poolView) bool { return p.InFlight > 0 })
	}
	for _, f := range fs { // every fleetd has seen every pool busy
		for i := range hosts {
			f.waitHost(fmt.Sprintf("host%d", i+1), 10*time.Second, "busy", func(h fleetHost) bool { return len(h.Pools) == 1 && h.Pools[0].InFlight > 0 })
		}
	}
	var mu sync.Mutex // guards byHost
	byHost := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		f := fs[i%len(fs)]
		wg.Go(func() {
			code, host, body, err := f.post(ctx, fmt.Sprintf(`{"model": "d", "max_tokens": 2, "messages": [{"role": "user", "content": "cold %d"}]}`, i))
			if err != nil || code != http.StatusOK {
				t.Errorf("d %d: %d from %q: %s %v", i, code, host, body, err)
			}
			mu.Lock()
			byHost[host]++
			mu.Unlock()
		})
	}
	wg.Wait()
	streams.Wait()
	return starts(t, hosts) - before, byHost
}

// A burst for a model awake nowhere, with no idle pool anywhere, loads the
// model on one host only: the first request claims a host for the new copy
// and the rest follow it.
func TestFleetColdBurst(t *testing.T) {
	hosts := busyFleet(t)
	f := startFleetd(t, hosts, "--scale-out=false")
	started, byHost := coldBurst(t, hosts, []*fleetd{f}, 30)
	t.Logf("30 concurrent requests for a cold model, every pool busy: %v engine start(s) fleet-wide; answers by host %v", started, byHost)
	if started != 1 || len(byHost) != 1 {
		t.Fatalf("%v engine starts (answers by host %v), want exactly one", started, byHost)
	}
}

// Two fleetd replicas sharing a real Redis claim a cold model's copy there:
// a burst through both loads one copy.
func TestFleetTwoReplicasRedis(t *testing.T) {
	url := rdbtest.Start(t)
	hosts := busyFleet(t)
	f1 := startFleetd(t, hosts, "--scale-out=false", "--redis-url", url)
	f2 := startFleetd(t, hosts, "--scale-out=false", "--redis-url", url)
	started, byHost := coldBurst(t, hosts, []*fleetd{f1, f2}, 30)
	followed := metricSum(t, f1.url, "fleetd_copy_claims_total", `result="followed"`) + metricSum(t, f2.url, "fleetd_copy_claims_total", `result="followed"`)
	t.Logf("30 concurrent requests for a cold model through two replicas: %v engine start(s) fleet-wide; answers by host %v; claims followed %v", started, byHost, followed)
	if started != 1 || len(byHost) != 1 {
		t.Fatalf("%v engine starts (answers by host %v), want exactly one", started, byHost)
	}
}

// A host SIGSTOPped under load is found silent and ejected within 3 s with
// the default poll settings; its requests that had no answer yet are
// cancelled there and retried elsewhere, so no client waits more than 5 s.
// After SIGCONT it is re-admitted.
func TestFleetSilentHost(t *testing.T) {
	hosts := hostsWithA(t, 3, nil)
	// fleetd's own defaults for silence (the harness polls faster).
	f := startFleetd(t, hosts, "--poll-interval", "1s", "--poll-timeout", "750ms", "--silent-after", "2", "--scale-out=false")
	victim := hosts[1]
	defer victim.cmd.Process.Signal(syscall.SIGCONT) // whatever happens

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	load, stopLoad := context.WithCancel(ctx)
	var mu sync.Mutex // guards the figures below
	var worst time.Duration
	served, failed := 0, 0
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; load.Err() == nil; i++ {
				start := time.Now()
				code, _, _, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "client %d request %d"}]}`, c, i))
				took := time.Since(start)
				mu.Lock()
				worst = max(worst, took)
				if err == nil && code == http.StatusOK {
					served++
				} else {
					failed++
				}
				mu.Unlock()
			}
		})
	}
	// Under load for a moment, then stop host2 for 20 s.
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		n := served
		mu.Unlock()
		if n >= 50 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var unhealthyAfter time.Duration
	for deadline := stopped.Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		h := f.hosts()["host2"]
		if !h.Healthy && unhealthyAfter == 0 {
			unhealthyAfter = time.Since(stopped)
		}
		if h.Ejected {
			break
		}
	}
	ejectedAfter := time.Since(stopped)
	pause := time.NewTimer(20*time.Second - time.Since(stopped))
	<-pause.C
	if err := victim.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopLoad()
	wg.Wait()
	retried := metricSum(t, f.url, "fleetd_retries_total", `host="host2"`, `cause="silent"`)
	t.Logf("host2 stopped 20s under load: shown not healthy after %s, ejected after %s; %d requests served, %d failed, longest wait %s, %v retried after the silence",
		unhealthyAfter.Round(time.Millisecond), ejectedAfter.Round(time.Millisecond), served, failed, worst.Round(time.Millisecond), retried)
	if unhealthyAfter == 0 || unhealthyAfter > ejectedAfter {
		t.Errorf("/status showed host2 not healthy after %s (ejected after %s)", unhealthyAfter, ejectedAfter)
	}
	if ejectedAfter > 3*time.Second {
		t.Errorf("ejected after %s, want within 3s", ejectedAfter)
	}
	if worst > 5*time.Second || failed > 0 {
		t.Errorf("a client waited %s (%d failed), want no wait over 5s and no failure", worst, failed)
	}
	if v := metricSum(t, f.url, "fleetd_host_ejections_total", `host="host2"`, `cause="silent"`); v != 1 {
		t.Errorf("fleetd_host_ejections_total{host2,silent} = %v", v)
	}
	f.waitHost("host2", 20*time.Second, "re-admitted", func(h fleetHost) bool { return h.Healthy && !h.Ejected })
}

// fleetd answers a body trickled in past its read timeout with 408, as
// poold does, instead of holding the connection.
func TestFleetReadTimeout(t *testing.T) {
	tag := t.Name()
	h := startPoold(t, tag, hostProfiles(tag, "a", []string{"a"}))
	h.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	f := startFleetd(t, []*daemon{h}, "--read-timeout", "1s")
	c, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := fmt.Sprintf(shortChat, "a")
	start := time.Now()
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: fleetd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		t.Fatal(err)
	}
	// One byte every 200 ms: the whole body would take far longer than 1 s.
	answered := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(c).ReadString('\n')
		answered <- line
	}()
	var line string
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
trickle:
	for i := 0; i < len(body); i++ {
		select {
		case line = <-answered:
			break trickle
		case <-tick.C:
			_, _ = c.Write([]byte{body[i]})
		}
	}
	if line == "" {
		select {
		case line = <-answered:
		case <-time.After(10 * time.Second):
		}
	}
	took := time.Since(start)
	t.Logf("a body trickled at 5 bytes/s with --read-timeout 1s: %q after %s", strings.TrimSpace(line), took.Round(time.Millisecond))
	if !strings.Contains(line, " 408 ") || took > 10*time.Second {
		t.Fatalf("answer %q after %s, want 408 soon after 1s", line, took)
	}
}

// Between two polls, requests that ended still count: fleetd tracks its own
// forwards as deltas on top of the last poll, so a host whose streams just
// ended is seen idle at once, not as busy as the poll said.
func TestFleetDeltasBetweenPolls(t *testing.T) {
	hosts := hostsWithA(t, 3, nil)
	// Strictly by load (no affinity slack), and polls far apart.
	f := startFleetd(t, hosts, "--poll-interval", "4s", "--affinity-epsilon", "0", "--load-slack", "0", "--scale-out=false")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// 30 long streams, opened one by one: 10 on each host.
	type open struct {
		cancel context.CancelFunc
		host   string
	}
	var streams []open
	perHost := map[string]int{}
	for i := range 30 {
		sctx, scancel := context.WithCancel(ctx)
		resp, _ := f.openStream(sctx, "a", 2000, "X-Session-Id", fmt.Sprintf("long-%d", i))
		defer resp.Body.Close()
		host := resp.Header.Get("X-Fleet-Host")
		streams = append(streams, open{scancel, host})
		perHost[host]++
	}
	if len(perHost) != 3 || perHost["host1"] != 10 {
		t.Fatalf("streams by host %v, want 10 each", perHost)
	}
	// Wait for a poll of every host that saw them.
	for i := range hosts {
		f.waitHost(fmt.Sprintf("host%d", i+1), 15*time.Second, "10 in flight polled", func(h fleetHost) bool { return len(h.Pools) == 1 && h.Pools[0].InFlight == 10 })
	}
	// host1's streams end; the next poll is seconds away.
	for _, s := range streams {
		if s.host == "host1" {
			s.cancel()
		}
	}
	hosts[0].waitPool("gpu0", 5*time.Second, "host1 idle", func(p poolView) bool { return p.InFlight == 0 })
	byHost := map[string]int{}
	var mu sync.Mutex // guards byHost
	var wg sync.WaitGroup
	for i := range 9 {
		wg.Go(func() {
			code, host, body, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "wave %d"}]}`, i))
			if err != nil || code != http.StatusOK {
				t.Errorf("%d %s %v", code, body, err)
			}
			mu.Lock()
			byHost[host]++
			mu.Unlock()
		})
	}
	wg.Wait()
	polled := f.hosts()["host1"].Pools[0].InFlight
	t.Logf("a wave of 9 after host1's 10 streams ended, before its next poll: by host %v (fleetd's last poll of host1 says %d in flight)", byHost, polled)
	if byHost["host1"] != 9 {
		t.Fatalf("the wave went %v; want all of it on host1, the idle one", byHost)
	}
}

// A host whose streams are 10× slower is measured (fleetd times the gaps
// between stream chunks) and served only when the fast hosts are ten times
// as busy; a session that hashed to it moves to a fast host.
func TestFleetSlowHost(t *testing.T) {
	hosts := hostsWithA(t, 3, func(i int) []string {
		if i == 2 {
			return []string{"--sim-itl", "200ms"}
		}
		return nil
	})
	f := startFleetd(t, hosts, "--scale-out=false")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	stream := func(key string) string {
		t.Helper()
		resp, rd := f.openStream(ctx, "a", 5, "X-Session-Id", key)
		defer resp.Body.Close()
		for {
			if _, err := rd.ReadString('\n'); err != nil {
				break
			}
		}
		return resp.Header.Get("X-Fleet-Host")
	}
	// Find a session that hashes to the slow host while its speed is not
	// known yet, and let every host serve a stream, which measures it.
	slowKey := ""
	served := map[string]bool{}
	for i := 0; i < 40 && (slowKey == "" || len(served) < 3); i++ {
		key := fmt.Sprintf("probe-%d", i)
		host := stream(key)
		served[host] = true
		if host == "host3" && slowKey == "" {
			slowKey = key
		}
	}
	if slowKey == "" || len(served) < 3 {
		t.Fatalf("40 sessions went to %v only", served)
	}
	stayed := 0
	for range 15 {
		if stream(slowKey) == "host3" {
			stayed++
		}
	}
	// Three concurrent closed-loop clients, 60 streams.
	var mu sync.Mutex // guards byHost
	byHost := map[string]int{}
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() {
			for i := range 20 {
				host := stream(fmt.Sprintf("client-%d-%d", c, i))
				mu.Lock()
				byHost[host]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("host3 10x slower: its session stayed %d of 15 times; 60 streams from 3 clients by host %v", stayed, byHost)
	if stayed > 1 {
		t.Errorf("the session of the slow host stayed there %d of 15 times", stayed)
	}
	if byHost["host3"] > 2 {
		t.Errorf("the slow host served %d of 60 streams", byHost["host3"])
	}
}

// Bounded-load affinity, both cases: a session stays on its host while the
// host's load is within (1+ε)× the mean (11 streams against 8 and 8: the
// old slack of one request would have moved it), and moves once the host is
// above (14 against 8 and 8).
func TestFleetAffinityBoundedLoad(t *testing.T) {
	hosts := hostsWithA(t, 3, nil)
	f := startFleetd(t, hosts, "--scale-out=false") // ε 0.25 and slack 1, the defaults
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// A session whose host, among equals, is host1.
	key := ""
	for i := 0; i < 60 && key == ""; i++ {
		k := fmt.Sprintf("session-%d", i)
		if _, host, _, _ := f.post(ctx, fmt.Sprintf(shortChat, "a"), "X-Session-Id", k); host == "host1" {
			key = k
		}
	}
	if key == "" {
		t.Fatal("no session of 60 went to host1")
	}
	// Other clients' streams, sent to the hosts directly: fleetd sees them
	// in its polls.
	busy := func(h *daemon, n int) {
		for range n {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/v1/chat/completions", strings.NewReader(chatBody("a", true, 2000)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { resp.Body.Close() })
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	load := func(want ...int) {
		for i, n := range want {
			f.waitHost(fmt.Sprintf("host%d", i+1), 15*time.Second, fmt.Sprintf("%d in flight", n), func(h fleetHost) bool { return len(h.Pools) == 1 && h.Pools[0].InFlight == n })
		}
	}
	session := func() map[string]int {
		by := map[string]int{}
		for range 5 {
			code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "a"), "X-Session-Id", key)
			if err != nil || code != http.StatusOK {
				t.Fatalf("%d %s %v", code, body, err)
			}
			by[host]++
		}
		return by
	}
	busy(hosts[0], 11)
	busy(hosts[1], 8)
	busy(hosts[2], 8)
	load(11, 8, 8)
	within := session()
	busy(hosts[0], 3)
	load(14, 8, 8)
	above := session()
	t.Logf("session %s: with 11/8/8 streams in flight, by host %v; with 14/8/8, by host %v", key, within, above)
	if within["host1"] != 5 {
		t.Errorf("within (1+ε)× the mean, the session moved: %v", within)
	}
	if above["host1"] != 0 {
		t.Errorf("above (1+ε)× the mean, the session stayed: %v", above)
	}
}

// An empty pool comes before a pool that holds an idle model, across hosts
// and whatever the weights: a cold model loads on the empty host and the
// warm model stays.
func TestFleetEmptyBeforeIdle(t *testing.T) {
	models := []string{"a", "b"}
	h1 := startPoold(t, t.Name()+"-1", hostProfiles(t.Name()+"-1", "a", models))
	h2 := startPoold(t, t.Name()+"-2", hostProfiles(t.Name()+"-2", "", models))
	h1.waitPool("gpu0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" })
	// host1 weighs twice as much as host2.
	f := startFleetdWeighted(t, []*daemon{h1, h2}, []int{2, 1}, "--scale-out=false")
	f.waitHost("host1", 10*time.Second, "a ready", func(h fleetHost) bool { return len(h.Pools) == 1 && h.Pools[0].State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, host, body, err := f.post(ctx, fmt.Sprintf(shortChat, "b"))
	t.Logf("b, awake nowhere, with a idle on host1 (weight 2) and host2 empty: %d from %s", code, host)
	if err != nil || code != http.StatusOK || host != "host2" {
		t.Fatalf("b: %d from %q: %s %v", code, host, body, err)
	}
	if p := h1.pool("gpu0"); p.Profile != "a" || p.SwitchingTo != "" {
		t.Fatalf("host1's idle model was evicted: %+v", p)
	}
	if !f.logged(map[string]any{"model": "b", "reason": "empty", "host": "host2"}) {
		t.Fatalf("no access log line with reason empty:\n%s", f.stdout.String())
	}
}
