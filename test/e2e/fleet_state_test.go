package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb/rdbtest"
	"github.com/poold/poold/internal/statusapi"
)

// Two fleetd replicas sharing a Redis whose tenants files give team-a 60
// and 600 requests a minute keep a bucket each: once the replica at 60 has
// spent its 60, the one at 600 still serves all of 100 (on the shared
// bucket of before, 2 of 100). Each shows the other's limits in /status, and
// `fleetd status` prints them.
func TestFleetTenantsDifferentFiles(t *testing.T) {
	url := rdbtest.Start(t)
	hosts := hostsWithA(t, 1, nil)
	slow := startFleetd(t, hosts, "--redis-url", url, "--redis-timeout", "10s", "--tenants", writeTenants(t, tenantsJSON(team("team-a", 60, 0))))
	fast := startFleetd(t, hosts, "--redis-url", url, "--redis-timeout", "10s", "--tenants", writeTenants(t, tenantsJSON(team("team-a", 600, 0))))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	burst := func(f *fleetd, n int) (ok int) {
		var mu sync.Mutex // guards ok
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				resp, body, err := f.send(ctx, "/v1/chat/completions", "team-a", fmt.Sprintf(shortChat, "a"))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
					t.Errorf("%d %s", resp.StatusCode, body)
				}
				mu.Lock()
				defer mu.Unlock()
				if resp.StatusCode == http.StatusOK {
					ok++
				}
			})
		}
		wg.Wait()
		return ok
	}
	if n := burst(slow, 100); n < 60 || n > 65 {
		t.Fatalf("the replica at 60 rpm served %d of 100", n)
	}
	if n := burst(fast, 100); n != 100 {
		t.Fatalf("the replica at 600 rpm served %d of 100 after the one at 60 spent its limit, want all", n)
	}

	for _, c := range []struct {
		f            *fleetd
		ours, theirs string
	}{{slow, "rpm=60 tpm=0", "rpm=600 tpm=0"}, {fast, "rpm=600 tpm=0", "rpm=60 tpm=0"}} {
		var got []statusapi.LimitsDisagreement
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if got = c.f.status().TenantLimits.Disagreements; len(got) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no disagreement in /status within 30s: %+v", got)
			}
		}
		if d := got[0]; d.Tenant != "team-a" || d.Ours != c.ours || d.Limits != c.theirs || d.Replica == "" {
			t.Fatalf("the disagreement shown: %+v, want ours %s, theirs %s", d, c.ours, c.theirs)
		}
		if n := strings.Count(c.f.stderr.String(), "tenant limits differ between replicas"); n != 1 {
			t.Fatalf("the disagreement logged %d times, want once", n)
		}
		code, out, stderr := runCLI(t, nil, fleetdBin, "status", "--addr", c.f.url)
		if want := "tenant team-a: limits " + c.ours + " here, " + c.theirs + " at replica " + got[0].Replica; code != 0 || !strings.Contains(out, want) {
			t.Fatalf("fleetd status: exit %d, lacks %q:\n%s%s", code, want, out, stderr)
		}
	}
}

// A hosts file that replaces every host serving model a, written under
// load while the new host cannot be polled (SIGSTOP), answers no request
// with 404 model_not_found: the old hosts serve until the new one has been
// polled, then it serves alone.
func TestFleetHostsFileFlip(t *testing.T) {
	hosts := hostsWithA(t, 3, nil)
	f := startFleetd(t, hosts[:2])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var mu sync.Mutex // guards the figures below
	codes, by := make(map[int]int), make(map[string]int)
	served := 0
	var problems []string
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := 0; i < 5000 && load.Err() == nil; i++ {
				code, host, body, err := f.post(ctx, fmt.Sprintf(`{"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "client %d request %d"}]}`, c, i))
				mu.Lock()
				switch {
				case err != nil && load.Err() == nil:
					problems = append(problems, err.Error())
				case err == nil && code != http.StatusOK:
					problems = append(problems, fmt.Sprintf("%d %s", code, body))
				}
				codes[code]++
				by[host]++
				served++
				mu.Unlock()
			}
		})
	}
	waitServed := func(n int, within time.Duration) {
		t.Helper()
		mu.Lock()
		want := served + n
		mu.Unlock()
		for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			done := served >= want
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d requests answered within %s", n, within)
			}
		}
	}
	waitServed(40, 20*time.Second)

	newHost := hosts[2]
	if err := newHost.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer newHost.cmd.Process.Signal(syscall.SIGCONT) // whatever happens
	before := f.status().HostsFile.SHA256
	data, _ := json.Marshal(map[string]any{"hosts": []map[string]any{{"name": "host3", "url": newHost.url}}})
	writeFile(t, f.hostsPath, data)
	for deadline := time.Now().Add(20 * time.Second); f.status().HostsFile.SHA256 == before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the new hosts file was not loaded within 20s")
		}
	}
	waitServed(40, 3*time.Second) // the new host cannot be polled meanwhile
	if err := newHost.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		hs := f.hosts()
		if h, ok := hs["host3"]; ok && h.Healthy && len(hs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet is not host3 alone within 20s: %+v", hs)
		}
	}
	mu.Lock()
	old := by["host1"] + by["host2"]
	mu.Unlock()
	waitServed(40, 20*time.Second)
	stopLoad()
	wg.Wait()
	t.Logf("%d requests across the change: %v, by host %v", served, codes, by)
	if len(problems) > 0 {
		t.Fatalf("%d requests failed, the first: %s", len(problems), problems[0])
	}
	// Each of the 4 clients may have had one request on an old host when
	// the fleet became host3 alone: those end after it, none starts.
	if more := by["host1"] + by["host2"] - old; more > 4 || by["host3"] == 0 {
		t.Fatalf("after the change the old hosts served %d more, host3 %d", by["host1"]+by["host2"]-old, by["host3"])
	}
}

// A stalled Redis (SIGSTOP) trips fleetd's breaker: after the first few
// checks that wait out --redis-timeout, requests no longer wait for Redis
// (none waits it out twice in a row: a probe, every backoff, costs one
// request at most one wait), fail-open serves them all and fail-closed
// refuses them at once; after SIGCONT the breaker closes and the limits are
// checked again. Latencies are counted against the timeout (1 s), not
// gated on tight figures.
func TestFleetRedisStalled(t *testing.T) {
	srv := rdbtest.Run(t)
	hosts := hostsWithA(t, 1, nil)
	tenants := writeTenants(t, tenantsJSON(team("team-a", 100_000, 10_000_000)))
	const timeout = time.Second
	open := startFleetd(t, hosts, "--redis-url", srv.URL, "--tenants", tenants, "--redis-timeout", timeout.String())
	closed := startFleetd(t, hosts, "--redis-url", srv.URL, "--tenants", tenants, "--redis-timeout", timeout.String(), "--redis-fail-closed")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type answer struct {
		code int
		took time.Duration
	}
	send := func(f *fleetd) answer {
		t.Helper()
		start := time.Now()
		resp, body, err := f.send(ctx, "/v1/chat/completions", "team-a", fmt.Sprintf(shortChat, "a"))
		if err != nil {
			t.Fatal(err)
		}
		if f == closed && resp.StatusCode == http.StatusTooManyRequests && !strings.Contains(string(body), "could not be checked") {
			t.Fatalf("fail-closed: %s", body)
		}
		return answer{resp.StatusCode, time.Since(start)}
	}
	// twice counts the answers from the first-th on that waited out the
	// timeout right after another that did, and slow all that waited it out.
	twice := func(as []answer, first int) (n, slow int) {
		for i, a := range as {
			if a.took >= timeout {
				slow++
				if i >= first && as[i-1].took >= timeout {
					n++
				}
			}
		}
		return n, slow
	}
	for _, f := range []*fleetd{open, closed} {
		if a := send(f); a.code != http.StatusOK {
			t.Fatalf("with Redis: %d", a.code)
		}
	}

	srv.Pause()
	var as []answer
	// Past one backoff (5 s) after the breaker opened, so that a probe is in.
	for start := time.Now(); time.Since(start) < 9*time.Second && len(as) < 5000; {
		as = append(as, send(open))
	}
	// The first request waits out two checks (its admission and its
	// reservation), the second one, the third breaker-worthy failure.
	n, slow := twice(as, 2)
	for _, a := range as {
		if a.code != http.StatusOK {
			t.Fatalf("fail-open answered %d", a.code)
		}
	}
	t.Logf("fail-open: %d requests while Redis was stalled, %d waited out the timeout", len(as), slow)
	if n > 0 || slow > 5 {
		t.Fatalf("fail-open: %d requests after the first few waited out the timeout right after another, %d in all (%d requests)", n, slow, len(as))
	}
	if v := metricSum(t, open.url, "fleetd_redis_breaker_open"); v != 1 {
		t.Fatalf("fleetd_redis_breaker_open = %v during the stall", v)
	}
	if v := metricSum(t, open.url, "fleetd_redis_breaker_trips_total"); v < 2 {
		t.Fatalf("fleetd_redis_breaker_trips_total = %v, want the opening and a failed probe", v)
	}
	var cs []answer
	for range 20 {
		cs = append(cs, send(closed))
	}
	for _, a := range cs {
		if a.code != http.StatusTooManyRequests {
			t.Fatalf("fail-closed answered %d", a.code)
		}
	}
	// Fail-closed stops at the admission: three requests wait it out.
	if n, slow := twice(cs, 3); n > 0 || slow > 3 {
		t.Fatalf("fail-closed: %d waited out the timeout twice in a row, %d in all", n, slow)
	}
	if !strings.Contains(open.stderr.String(), "redis breaker open") {
		t.Fatal("the breaker's opening is not logged")
	}

	srv.Resume()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, _, err := open.send(ctx, "/v1/chat/completions", "team-a", fmt.Sprintf(shortChat, "a"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") == "100000" && metricSum(t, open.url, "fleetd_redis_breaker_open") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the breaker did not close within 60s of SIGCONT")
		}
	}
	if !strings.Contains(open.stderr.String(), "redis breaker closed") {
		t.Fatal("the breaker's closing is not logged")
	}
}
