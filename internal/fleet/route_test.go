package fleet

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/poold/poold/internal/placement"
)

// Pools in the states a host reports, for model "m".
var (
	awake     = PoolView{Name: "p0", State: "ready", Profile: "m"}
	awakeBusy = PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 3, Waiting: 1}
	draining  = PoolView{Name: "p0", State: "draining", Profile: "m", GateClosed: true, InFlight: 1, Waiting: 2}
	loading   = PoolView{Name: "p0", State: "starting", SwitchingTo: "m", Waiting: 2}
	asleep    = PoolView{Name: "p0", State: "ready", Profile: "other", Sleeping: []string{"m"}, InFlight: 1}
	empty     = PoolView{Name: "p0", State: "empty"}
	idleOther = PoolView{Name: "p0", State: "ready", Profile: "other"}
	failed    = PoolView{Name: "p0", State: "failed"}
	busyOther = PoolView{Name: "p0", State: "ready", Profile: "other", InFlight: 2, Waiting: 1}
	stopping  = PoolView{Name: "p0", State: "stopping"}
)

func named(p PoolView, name string) PoolView { p.Name = name; return p }

func TestScore(t *testing.T) {
	cases := []struct {
		name     string
		host     HostView
		rank     placement.Rank
		load     int
		eligible bool
	}{
		{"awake", HostView{Pools: []PoolView{awake}}, placement.Awake, 0, true},
		{"awake counts in-flight plus waiting", HostView{Pools: []PoolView{awakeBusy}}, placement.Awake, 4, true},
		{"awake but draining counts as loading: no second copy", HostView{Pools: []PoolView{draining}}, placement.Loading, 3, true},
		{"loading", HostView{Pools: []PoolView{loading}}, placement.Loading, 2, true},
		{"asleep", HostView{Pools: []PoolView{asleep}}, placement.Asleep, 1, true},
		{"empty pool", HostView{Pools: []PoolView{empty}}, placement.Empty, 0, true},
		{"pool idle with another profile is idle", HostView{Pools: []PoolView{idleOther}}, placement.Idle, 0, true},
		{"failed pool with nothing waiting is empty", HostView{Pools: []PoolView{failed}}, placement.Empty, 0, true},
		{"busy with another profile queues", HostView{Pools: []PoolView{busyOther}}, placement.Queue, 3, true},
		{"stopping pool queues even when empty", HostView{Pools: []PoolView{stopping}}, placement.Queue, 0, true},
		{"ineligible pool is skipped", HostView{Eligible: []string{"p1"}, Pools: []PoolView{awake, named(busyOther, "p1")}}, placement.Queue, 3, true},
		{"no eligible pool: host cannot serve", HostView{Eligible: []string{"p9"}, Pools: []PoolView{awake}}, 0, 0, false},
		{"no pools: host cannot serve", HostView{}, 0, 0, false},
		{"best tier among pools", HostView{Pools: []PoolView{busyOther, named(loading, "p1"), named(awakeBusy, "p2")}}, placement.Awake, 4, true},
		{"least load within the best tier", HostView{Pools: []PoolView{awakeBusy, named(awake, "p1")}}, placement.Awake, 0, true},
		{"requests sent since the poll raise the load", HostView{Delta: map[string]int{"m": 5}, Pools: []PoolView{awakeBusy}}, placement.Awake, 9, true},
		{"requests ended since the poll lower the load", HostView{Delta: map[string]int{"m": -3}, Pools: []PoolView{awakeBusy}}, placement.Awake, 1, true},
		{"the load never goes below the waiting", HostView{Delta: map[string]int{"m": -9}, Pools: []PoolView{awakeBusy}}, placement.Awake, 1, true},
		{"requests sent to an empty pool mean loading", HostView{Delta: map[string]int{"m": 1}, Pools: []PoolView{empty}}, placement.Loading, 1, true},
		{"requests sent to an asleep model mean waking", HostView{Delta: map[string]int{"m": 2}, Pools: []PoolView{asleep}}, placement.Loading, 3, true},
		{"requests sent for the loaded profile make an idle pool busy", HostView{Delta: map[string]int{"other": 1}, Pools: []PoolView{idleOther}}, placement.Queue, 1, true},
		{"requests sent to a queue mean loading: the burst follows them", HostView{Delta: map[string]int{"m": 1}, Pools: []PoolView{busyOther}}, placement.Loading, 4, true},
		{"a claimed host is loading", HostView{Claimed: true, Pools: []PoolView{busyOther}}, placement.Loading, 3, true},
		{"a claim does not demote an awake host", HostView{Claimed: true, Pools: []PoolView{awake}}, placement.Awake, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.host.Root = "m"
			got, ok := score(c.host, RouteOptions{})
			if ok != c.eligible || ok && (got.Rank != c.rank || got.Load != c.load) {
				t.Fatalf("score = %v, %d, %v; want %v, %d, %v", got.Rank, got.Load, ok, c.rank, c.load, c.eligible)
			}
			c.host.Name = "h"
			if got := len(Route([]HostView{c.host}, "", RouteOptions{})) == 1; got != c.eligible {
				t.Fatalf("routable = %v; want %v", got, c.eligible)
			}
		})
	}
}

func hv(name string, pools ...PoolView) HostView {
	return HostView{Name: name, Weight: 1, Root: "m", Pools: pools}
}

// t0 is the routing's now in the tests that give engines' samples.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// withEngine is p with its engine's sample, taken at t0: running and
// waiting requests, and KV cache use kv.
func withEngine(p PoolView, running, waiting int, kv float64) PoolView {
	p.Engine = &EngineLoad{Running: running, Waiting: waiting, KVCacheUsage: kv, SampledAt: t0}
	return p
}

// withQueued is p with n requests for its profile in poold's queue.
func withQueued(p PoolView, n int) PoolView {
	p.Queued = map[string]int{p.Profile: n}
	p.Waiting += n
	return p
}

// stale is p with its engine's sample a minute older than t0.
func stale(p PoolView) PoolView {
	e := *p.Engine
	e.SampledAt = t0.Add(-time.Minute)
	p.Engine = &e
	return p
}

// hot is an awake copy past the waiting threshold; kvFull one past the KV
// cache threshold; backlog one whose poold queue is past the waiting
// threshold while its engine queues nothing.
var (
	hot     = withEngine(awake, 4, 11, 0.5)
	kvFull  = withEngine(awake, 2, 0, 0.9)
	backlog = withQueued(withEngine(awake, 4, 0, 0.2), 11)
)

// withLastUsed is p last used ago before a fixed moment.
func withLastUsed(p PoolView, ago time.Duration) PoolView {
	p.LastUsed = t0.Add(-ago)
	return p
}
func withWeight(h HostView, w int) HostView          { h.Weight = w; return h }
func withHealth(h HostView, s Health) HostView       { h.Health = s; return h }
func withITL(h HostView, itl time.Duration) HostView { h.ITL = itl; return h }
func hostsOf(cs []Choice) (out []string) {
	for _, c := range cs {
		out = append(out, c.Host+"/"+c.Reason)
	}
	return out
}

func TestRoute(t *testing.T) {
	cases := []struct {
		name  string
		hosts []HostView
		scale bool // scale out
		slack int
		want  []string
	}{
		// Health before rank: a success ratio, not speed or warmth, decides.
		{"a trial goes first, then healthy, degraded and key-refused hosts",
			[]HostView{withHealth(hv("refused", awake), KeyRefused), withHealth(hv("degraded", awake), Degraded), hv("healthy", busyOther), withHealth(hv("trial", empty), Trial)}, false, 0,
			[]string{"trial/empty", "healthy/queue", "degraded/awake", "refused/awake"}},
		{"a degraded host does not take a scale-out",
			[]HostView{hv("a", hot), withHealth(hv("d", empty), Degraded)}, true, 0,
			[]string{"a/awake", "d/empty"}},
		// A slow host's load counts as many times over as it is slower.
		{"a host 10x slower loses to a busier fast one",
			[]HostView{withITL(hv("slow", awake), 200*time.Millisecond), withITL(hv("fast", awakeBusy), 20*time.Millisecond)}, false, 0,
			[]string{"fast/awake", "slow/awake"}},
		{"a host 10x slower wins once the fast one is 10x busier",
			[]HostView{withITL(hv("slow", awake), 200*time.Millisecond), withITL(hv("fast", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 12}), 20*time.Millisecond)}, false, 0,
			[]string{"slow/awake", "fast/awake"}},
		{"an unknown speed counts as the fastest",
			[]HostView{hv("unknown", awake), withITL(hv("fast", awakeBusy), 20*time.Millisecond)}, false, 0,
			[]string{"unknown/awake", "fast/awake"}},
		{"no hosts", nil, true, 0, nil},
		{"ranks in order: awake, loading, asleep, empty, idle, queue",
			[]HostView{hv("q", busyOther), hv("i", idleOther), hv("e", empty), hv("s", asleep), hv("l", loading), hv("a", awakeBusy)}, false, 0,
			[]string{"a/awake", "l/loading", "s/asleep", "e/empty", "i/idle", "q/queue"}},
		{"an empty pool before an idle loaded one, whatever the weight",
			[]HostView{withWeight(hv("idle", idleOther), 2), hv("empty", empty)}, false, 0,
			[]string{"empty/empty", "idle/idle"}},
		{"idle: the least recently used first",
			[]HostView{hv("recent", withLastUsed(idleOther, time.Minute)), hv("old", withLastUsed(idleOther, time.Hour))}, false, 0,
			[]string{"old/idle", "recent/idle"}},
		{"awake with the fewest in flight plus waiting first",
			[]HostView{hv("busy", awakeBusy), hv("calm", awake)}, false, 0,
			[]string{"calm/awake", "busy/awake"}},
		{"a model awake elsewhere does not load on an idle host",
			[]HostView{hv("idle", empty), hv("awake", awakeBusy)}, false, 0,
			[]string{"awake/awake", "idle/empty"}},
		{"an idle host before a busy one",
			[]HostView{hv("busy", busyOther), hv("idle", idleOther)}, false, 0,
			[]string{"idle/idle", "busy/queue"}},
		{"shortest queue first",
			[]HostView{hv("long", busyOther), hv("short", PoolView{Name: "p0", State: "ready", Profile: "x", InFlight: 1})}, false, 0,
			[]string{"short/queue", "long/queue"}},
		// "key" hashes b above a.
		{"loads within the slack are equal: affinity decides",
			[]HostView{hv("a", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 1}), hv("b", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 2}), hv("c", awakeBusy)}, false, 1,
			[]string{"b/awake", "a/awake", "c/awake"}},
		{"without slack the lighter host wins",
			[]HostView{hv("a", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 1}), hv("b", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 2})}, false, 0,
			[]string{"a/awake", "b/awake"}},
		{"equal load: higher weight first",
			[]HostView{hv("light", awake), withWeight(hv("heavy", awake), 5)}, false, 0,
			[]string{"heavy/awake", "light/awake"}},
		{"scale-out: every awake copy is saturated, an idle pool goes first",
			[]HostView{hv("a", hot), hv("b", kvFull), hv("c", empty), hv("d", busyOther)}, true, 0,
			[]string{"c/scale-out", "b/awake", "a/awake", "d/queue"}},
		{"scale-out prefers waking an asleep copy over loading a cold one",
			[]HostView{hv("a", hot), hv("c", empty), hv("s", asleep)}, true, 0,
			[]string{"s/scale-out", "a/awake", "c/empty"}},
		{"no scale-out while one awake copy is unsaturated",
			[]HostView{hv("a", hot), hv("b", awakeBusy), hv("c", empty)}, true, 0,
			[]string{"b/awake", "a/awake", "c/empty"}},
		{"at the thresholds a copy is not saturated",
			[]HostView{hv("a", withEngine(awake, 4, 10, 0.85)), hv("c", empty)}, true, 0,
			[]string{"a/awake", "c/empty"}},
		{"KV cache use just past the threshold saturates",
			[]HostView{hv("a", withEngine(awake, 4, 0, 0.86)), hv("c", empty)}, true, 0,
			[]string{"c/scale-out", "a/awake"}},
		{"more than 10 in poold's queue saturates, the engine queueing nothing",
			[]HostView{hv("a", backlog), hv("c", empty)}, true, 0,
			[]string{"c/scale-out", "a/awake"}},
		{"a stale engine sample says nothing",
			[]HostView{hv("a", stale(hot)), hv("c", empty)}, true, 0,
			[]string{"a/awake", "c/empty"}},
		{"no scale-out while another copy is loading",
			[]HostView{hv("a", hot), hv("l", loading), hv("c", empty)}, true, 0,
			[]string{"a/awake", "l/loading", "c/empty"}},
		{"no scale-out without a spare pool",
			[]HostView{hv("a", hot), hv("q", busyOther)}, true, 0,
			[]string{"a/awake", "q/queue"}},
		{"no scale-out when it is off",
			[]HostView{hv("a", hot), hv("c", empty)}, false, 0,
			[]string{"a/awake", "c/empty"}},
		{"no engine sample and a short queue is not saturation",
			[]HostView{hv("a", awake), hv("c", empty)}, true, 0,
			[]string{"a/awake", "c/empty"}},
		// Engines' own load first, then KV cache use, then poold's queue.
		{"fewest engine requests first, when more than poold's in flight",
			[]HostView{hv("a", withEngine(PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 1}, 5, 1, 0.1)), hv("b", withEngine(PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 2}, 3, 0, 0.1))}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"poold's in flight when more than a lagging engine sample",
			[]HostView{hv("a", withEngine(PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 6}, 1, 0, 0.1)), hv("b", withEngine(awake, 3, 0, 0.1))}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"equal engine load: the least KV cache use first",
			[]HostView{hv("x", withEngine(awake, 10, 0, 0.5)), hv("y", withEngine(awake, 10, 0, 0.3)), hv("l", withEngine(awake, 0, 0, 0))}, false, 0,
			[]string{"l/awake", "y/awake", "x/awake"}},
		{"equal engine load and KV cache use: the shortest poold queue first",
			[]HostView{hv("y", withQueued(withEngine(awake, 8, 0, 0.3), 2)), hv("x", withEngine(awake, 10, 0, 0.3)), hv("l", withEngine(awake, 0, 0, 0))}, false, 0,
			[]string{"l/awake", "x/awake", "y/awake"}},
		{"a stale engine sample weighs by poold's counts",
			[]HostView{hv("a", stale(withEngine(awakeBusy, 0, 0, 0))), hv("b", withEngine(awake, 2, 0, 0))}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"a saturated copy after every unsaturated one, whatever its load",
			[]HostView{hv("a", kvFull), hv("b", withEngine(awake, 8, 0, 0.5))}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"poold's queue saturates a copy that looks lighter",
			[]HostView{hv("a", backlog), hv("b", withEngine(awake, 20, 0, 0.5))}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"saturated copies among themselves by load",
			[]HostView{hv("a", hot), hv("b", kvFull)}, false, 0,
			[]string{"b/awake", "a/awake"}},
		{"a saturated healthy copy before a degraded one",
			[]HostView{withHealth(hv("d", awake), Degraded), hv("a", hot)}, false, 0,
			[]string{"a/awake", "d/awake"}},
		{"a host that cannot run the model is left out",
			[]HostView{hv("a", awake), {Name: "x", Root: "m", Eligible: []string{"gpu9"}, Pools: []PoolView{empty}}}, true, 0,
			[]string{"a/awake"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := hostsOf(Route(c.hosts, "key", RouteOptions{ScaleOut: c.scale, Saturation: DefaultSaturation, StatsMaxAge: DefaultEngineStatsMaxAge, Now: t0, Slack: c.slack}))
			if !slices.Equal(got, c.want) {
				t.Fatalf("Route = %v; want %v", got, c.want)
			}
		})
	}
}

// Scale-out stops at the model's maxCopies awake copies.
func TestRouteMaxCopies(t *testing.T) {
	hosts := []HostView{hv("a", hot), hv("b", kvFull), hv("c", empty)}
	for _, c := range []struct {
		max  int
		want string
	}{{0, "c/scale-out"}, {3, "c/scale-out"}, {2, "b/awake"}, {1, "b/awake"}} {
		got := hostsOf(Route(hosts, "key", RouteOptions{ScaleOut: true, MaxCopies: c.max, Saturation: DefaultSaturation, Now: t0}))
		if got[0] != c.want {
			t.Errorf("maxCopies %d: Route = %v; want %s first", c.max, got, c.want)
		}
	}
}

// An awake copy's load and saturation come from its engine's fresh sample
// and poold's queue for it.
func TestScoreEngine(t *testing.T) {
	opts := RouteOptions{Saturation: DefaultSaturation, StatsMaxAge: DefaultEngineStatsMaxAge, Now: t0}
	cases := []struct {
		name      string
		host      HostView
		load      int
		saturated bool
	}{
		{"running plus waiting plus poold's queue", HostView{Pools: []PoolView{withQueued(withEngine(awake, 3, 1, 0.2), 2)}}, 6, false},
		{"requests sent since the poll run", HostView{Delta: map[string]int{"m": 2}, Pools: []PoolView{withQueued(withEngine(awake, 3, 1, 0.2), 2)}}, 8, false},
		{"requests ended since the poll: never fewer than none running", HostView{Delta: map[string]int{"m": -9}, Pools: []PoolView{withQueued(withEngine(awake, 3, 1, 0.2), 2)}}, 3, false},
		{"poold's in flight when more than the sample", HostView{Pools: []PoolView{withQueued(withEngine(PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 7}, 3, 1, 0.2), 2)}}, 9, false},
		{"a stale sample: poold's in flight plus waiting", HostView{Pools: []PoolView{stale(withEngine(awakeBusy, 9, 9, 1))}}, 4, false},
		{"KV cache use past the threshold", HostView{Pools: []PoolView{kvFull}}, 2, true},
		{"engine and poold waiting together past the threshold", HostView{Pools: []PoolView{withQueued(withEngine(awake, 4, 6, 0.2), 5)}}, 15, true},
		{"a stale sample: poold's queue alone can saturate", HostView{Pools: []PoolView{stale(backlog)}}, 11, true},
		{"an unsaturated pool before a saturated one of the same host", HostView{Pools: []PoolView{hot, named(withEngine(awake, 9, 0, 0.2), "p1")}}, 9, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.host.Root = "m"
			got, ok := score(c.host, opts)
			if !ok || got.Rank != placement.Awake || got.Load != c.load || got.saturated != c.saturated {
				t.Fatalf("score = %v, load %d, saturated %v, %v; want awake, %d, %v", got.Rank, got.Load, got.saturated, ok, c.load, c.saturated)
			}
		})
	}
}

// Among equals, the affinity key decides: the same key always picks the same
// host, whatever the order of the input, different keys spread over the
// hosts, and a host leaving moves only the keys it had.
func TestRouteAffinity(t *testing.T) {
	hosts := []HostView{hv("h1", awake), hv("h2", awake), hv("h3", awake), hv("h4", awake)}
	first := func(hs []HostView, key string) string { return Route(hs, key, RouteOptions{Slack: 1})[0].Host }
	picked := make(map[string]int)
	before := make(map[string]string)
	for i := range 200 {
		key := fmt.Sprintf("session-%d", i)
		h := first(hosts, key)
		picked[h]++
		before[key] = h
		rev := slices.Clone(hosts)
		slices.Reverse(rev)
		if got := first(rev, key); got != h {
			t.Fatalf("key %s: %s, then %s with the hosts reversed", key, h, got)
		}
	}
	if len(picked) != len(hosts) {
		t.Fatalf("200 keys used only %v", picked)
	}
	without := hosts[1:] // h1 leaves
	for key, h := range before {
		got := first(without, key)
		if h != "h1" && got != h {
			t.Fatalf("key %s moved from %s to %s when h1 left", key, h, got)
		}
	}
	// Load still comes before affinity.
	busy := []HostView{hv("h1", awakeBusy), hv("h2", awake)}
	for key := range before {
		if got := first(busy, key); got != "h2" {
			t.Fatalf("key %s went to the busier host %s", key, got)
		}
	}
}

// fleetd prefers a host where the model is loaded over one where poold
// released it, put to sleep (a wake) before stopped (a cold start).
func TestRouteLoadedBeforeReleased(t *testing.T) {
	releasedAsleep := PoolView{Name: "p0", State: "empty", Sleeping: []string{"m"}}
	releasedStopped := PoolView{Name: "p0", State: "empty"}
	hosts := []HostView{hv("stopped", releasedStopped), hv("asleep", releasedAsleep), hv("loaded", awake)}
	if got := hostsOf(Route(hosts, "", RouteOptions{})); !slices.Equal(got, []string{"loaded/awake", "asleep/asleep", "stopped/empty"}) {
		t.Fatalf("order %v, want loaded, asleep, stopped", got)
	}
}
