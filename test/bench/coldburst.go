package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Workload 1c: a cold burst through fleetd. Three poolds each have one pool,
// busy with streams of model a (sent to them directly); a burst of concurrent
// requests for model d, awake nowhere, each with its own content (so its own
// affinity key), goes through fleetd. fleetd should load d on one host:
// exactly one engine start fleet-wide.
const (
	burstHosts = 3
	burstSize  = 30
)

// burstProfiles is one host's profiles: pool gpu0 preloading a, and d,
// both loading in 500 ms with 20 ms between tokens; a minimum residency of
// 1 s lets the pool swap once its streams end.
func burstProfiles() []byte {
	var profs []map[string]any
	for _, id := range []string{"a", "d"} {
		profs = append(profs, map[string]any{"id": id, "command": []string{"{poold}", "engine-sim", "/models/{id}", "--port", "{port}",
			"--served-model-name", "{id}", "--sim-load-delay", "500ms", "--sim-itl", "20ms"}})
	}
	b, _ := json.Marshal(map[string]any{
		"pools":    []map[string]any{{"name": "gpu0", "gpus": []int{0}, "default": "a", "minResidency": "1s"}},
		"profiles": profs, "defaults": map[string]any{"stopTimeout": "10s", "startupTimeout": "30s"},
	})
	return b
}

func (b *bench) w1c(ctx context.Context) error {
	hosts := map[string]string{}
	var poolds []*proc
	defer func() {
		for _, p := range poolds {
			p.stop()
		}
	}()
	for i := range burstHosts {
		name := "burst-poold-" + strconv.Itoa(i+1)
		p, err := startPoold(b.dir, name, b.bin, burstProfiles())
		if err != nil {
			return err
		}
		poolds = append(poolds, p)
		hosts[name] = p.base
	}
	f, err := startFleet(b.dir, "burst-fleetd", b.fleetBin, hosts, "--poll-interval", "100ms", "--scale-out=false")
	if err != nil {
		return err
	}
	defer f.stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, p := range append(poolds, f) {
		if err := waitModels(wctx, p, "a"); err != nil {
			return err
		}
	}
	c := newClient(64)
	defer c.CloseIdleConnections()
	if err := waitUntil(wctx, "every pool ready with a", func() bool { return poolsReady(c, poolds, "a") }); err != nil {
		return err
	}
	before, err := engineStarts(poolds)
	if err != nil {
		return err
	}
	// Two streams of a per host, about 3 s each, sent to the poolds
	// directly (other clients' work), keep every pool busy.
	var streams sync.WaitGroup
	for _, p := range poolds {
		for range 2 {
			streams.Go(func() { do(ctx, c, p.base, chat("a", 150, true)) })
		}
	}
	if err := waitUntil(wctx, "every pool busy", func() bool { return poolsBusy(c, poolds, nil) }); err != nil {
		return err
	}
	if err := waitUntil(wctx, "fleetd seeing every pool busy", func() bool { return poolsBusy(c, poolds, f) }); err != nil {
		return err
	}
	var burst sync.WaitGroup
	failed := make(chan error, burstSize)
	start := time.Now()
	for i := range burstSize {
		burst.Go(func() {
			sh := chat("d", 2, false)
			sh.body = fmt.Appendf(nil, `{"model":"d","messages":[{"role":"user","content":"cold request %d"}],"max_tokens":2}`, i)
			if s := do(ctx, c, f.base, sh); s.err != nil {
				failed <- s.err
			}
		})
	}
	burst.Wait()
	took := time.Since(start)
	streams.Wait()
	close(failed)
	for err := range failed {
		b.rep.problem("1c: a request of the cold burst failed: %v", err)
	}
	after, err := engineStarts(poolds)
	if err != nil {
		return err
	}
	n := after - before
	b.rep.add("1c", fmt.Sprintf("cold burst of %d through fleetd, every pool busy: engine starts fleet-wide", burstSize), "", "",
		strconv.Itoa(int(n)), "1", ptr(n == 1))
	b.rep.add("1c", "cold burst: the last answer after", "", "", fmt.Sprintf("%.2f s", took.Seconds()), "", nil)
	return nil
}

// engineStarts sums the engines the poolds started.
func engineStarts(poolds []*proc) (float64, error) {
	var n float64
	for _, p := range poolds {
		m, err := scrape(p.base, "poold_engine_starts_total")
		if err != nil {
			return 0, err
		}
		n += sumMatching(m, `result="ok"`)
	}
	return n, nil
}

// poolState is what workload 1c reads of a pool in /status.
type poolState struct {
	State    string  `json:"state"`
	Profile  *string `json:"profile"`
	InFlight int     `json:"inFlight"`
}

// getJSON decodes GET url into v.
func getJSON(c *http.Client, url string, v any) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}

// poolStates reads every pool of every poold, or, with fleetd set, every
// pool as fleetd's last polls saw it.
func poolStates(c *http.Client, poolds []*proc, fleetd *proc) ([]poolState, bool) {
	var all []poolState
	if fleetd != nil {
		var st struct {
			Hosts []struct {
				Pools []poolState `json:"pools"`
			} `json:"hosts"`
		}
		if !getJSON(c, fleetd.base+"/status", &st) || len(st.Hosts) != len(poolds) {
			return nil, false
		}
		for _, h := range st.Hosts {
			all = append(all, h.Pools...)
		}
		return all, true
	}
	for _, p := range poolds {
		var st struct {
			Pools []poolState `json:"pools"`
		}
		if !getJSON(c, p.base+"/status", &st) {
			return nil, false
		}
		all = append(all, st.Pools...)
	}
	return all, true
}

func poolsReady(c *http.Client, poolds []*proc, model string) bool {
	ps, ok := poolStates(c, poolds, nil)
	for _, p := range ps {
		ok = ok && p.State == "ready" && p.Profile != nil && *p.Profile == model
	}
	return ok
}

// poolsBusy reports whether every pool has requests in flight, as the
// poolds say or, with fleetd set, as fleetd saw them last.
func poolsBusy(c *http.Client, poolds []*proc, fleetd *proc) bool {
	ps, ok := poolStates(c, poolds, fleetd)
	for _, p := range ps {
		ok = ok && p.InFlight > 0
	}
	return ok
}

// waitUntil polls cond every 10 ms until it holds or ctx ends.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}
