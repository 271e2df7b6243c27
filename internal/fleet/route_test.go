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
			got, ok := score(c.host)
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

func withWait(h HostView, d time.Duration) HostView { h.Wait = d; return h }

// withLastUsed is p last used ago before a fixed moment.
func withLastUsed(p PoolView, ago time.Duration) PoolView {
	p.LastUsed = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Add(-ago)
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
	const threshold = time.Second
	cases := []struct {
		name  string
		hosts []HostView
		wait  time.Duration
		slack int
		want  []string
	}{
		// Health before rank: a success ratio, not speed or warmth, decides.
		{"a trial goes first, then healthy, degraded and key-refused hosts",
			[]HostView{withHealth(hv("refused", awake), KeyRefused), withHealth(hv("degraded", awake), Degraded), hv("healthy", busyOther), withHealth(hv("trial", empty), Trial)}, 0, 0,
			[]string{"trial/empty", "healthy/queue", "degraded/awake", "refused/awake"}},
		{"a degraded host does not take a scale-out",
			[]HostView{withWait(hv("a", awake), 2*threshold), withHealth(hv("d", empty), Degraded)}, threshold, 0,
			[]string{"a/awake", "d/empty"}},
		// A slow host's load counts as many times over as it is slower.
		{"a host 10x slower loses to a busier fast one",
			[]HostView{withITL(hv("slow", awake), 200*time.Millisecond), withITL(hv("fast", awakeBusy), 20*time.Millisecond)}, 0, 0,
			[]string{"fast/awake", "slow/awake"}},
		{"a host 10x slower wins once the fast one is 10x busier",
			[]HostView{withITL(hv("slow", awake), 200*time.Millisecond), withITL(hv("fast", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 12}), 20*time.Millisecond)}, 0, 0,
			[]string{"slow/awake", "fast/awake"}},
		{"an unknown speed counts as the fastest",
			[]HostView{hv("unknown", awake), withITL(hv("fast", awakeBusy), 20*time.Millisecond)}, 0, 0,
			[]string{"unknown/awake", "fast/awake"}},
		{"no hosts", nil, threshold, 0, nil},
		{"ranks in order: awake, loading, asleep, empty, idle, queue",
			[]HostView{hv("q", busyOther), hv("i", idleOther), hv("e", empty), hv("s", asleep), hv("l", loading), hv("a", awakeBusy)}, 0, 0,
			[]string{"a/awake", "l/loading", "s/asleep", "e/empty", "i/idle", "q/queue"}},
		{"an empty pool before an idle loaded one, whatever the weight",
			[]HostView{withWeight(hv("idle", idleOther), 2), hv("empty", empty)}, 0, 0,
			[]string{"empty/empty", "idle/idle"}},
		{"idle: the least recently used first",
			[]HostView{hv("recent", withLastUsed(idleOther, time.Minute)), hv("old", withLastUsed(idleOther, time.Hour))}, 0, 0,
			[]string{"old/idle", "recent/idle"}},
		{"awake with the fewest in flight plus waiting first",
			[]HostView{hv("busy", awakeBusy), hv("calm", awake)}, 0, 0,
			[]string{"calm/awake", "busy/awake"}},
		{"a model awake elsewhere does not load on an idle host",
			[]HostView{hv("idle", empty), hv("awake", awakeBusy)}, 0, 0,
			[]string{"awake/awake", "idle/empty"}},
		{"an idle host before a busy one",
			[]HostView{hv("busy", busyOther), hv("idle", idleOther)}, 0, 0,
			[]string{"idle/idle", "busy/queue"}},
		{"shortest queue first",
			[]HostView{hv("long", busyOther), hv("short", PoolView{Name: "p0", State: "ready", Profile: "x", InFlight: 1})}, 0, 0,
			[]string{"short/queue", "long/queue"}},
		// "key" hashes b above a.
		{"loads within the slack are equal: affinity decides",
			[]HostView{hv("a", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 1}), hv("b", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 2}), hv("c", awakeBusy)}, 0, 1,
			[]string{"b/awake", "a/awake", "c/awake"}},
		{"without slack the lighter host wins",
			[]HostView{hv("a", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 1}), hv("b", PoolView{Name: "p0", State: "ready", Profile: "m", InFlight: 2})}, 0, 0,
			[]string{"a/awake", "b/awake"}},
		{"equal load: higher weight first",
			[]HostView{hv("light", awake), withWeight(hv("heavy", awake), 5)}, 0, 0,
			[]string{"heavy/awake", "light/awake"}},
		{"scale-out: every awake copy waits too long, an idle pool goes first",
			[]HostView{withWait(hv("a", awakeBusy), 2*threshold), withWait(hv("b", awake), 3*threshold), hv("c", empty), hv("d", busyOther)}, threshold, 0,
			[]string{"c/scale-out", "b/awake", "a/awake", "d/queue"}},
		{"scale-out prefers waking an asleep copy over loading a cold one",
			[]HostView{withWait(hv("a", awake), 2*threshold), hv("c", empty), hv("s", asleep)}, threshold, 0,
			[]string{"s/scale-out", "a/awake", "c/empty"}},
		{"no scale-out while one awake copy is fast",
			[]HostView{withWait(hv("a", awake), 2*threshold), withWait(hv("b", awakeBusy), threshold/2), hv("c", empty)}, threshold, 0,
			[]string{"a/awake", "b/awake", "c/empty"}},
		{"no scale-out while another copy is loading",
			[]HostView{withWait(hv("a", awake), 2*threshold), hv("l", loading), hv("c", empty)}, threshold, 0,
			[]string{"a/awake", "l/loading", "c/empty"}},
		{"no scale-out without a spare pool",
			[]HostView{withWait(hv("a", awake), 2*threshold), hv("q", busyOther)}, threshold, 0,
			[]string{"a/awake", "q/queue"}},
		{"no scale-out when it is off",
			[]HostView{withWait(hv("a", awake), time.Hour), hv("c", empty)}, 0, 0,
			[]string{"a/awake", "c/empty"}},
		{"unknown wait is not overload",
			[]HostView{hv("a", awake), hv("c", empty)}, threshold, 0,
			[]string{"a/awake", "c/empty"}},
		{"a host that cannot run the model is left out",
			[]HostView{hv("a", awake), {Name: "x", Root: "m", Eligible: []string{"gpu9"}, Pools: []PoolView{empty}}}, threshold, 0,
			[]string{"a/awake"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := hostsOf(Route(c.hosts, "key", RouteOptions{ScaleOutWait: c.wait, Slack: c.slack, Epsilon: 0}))
			if !slices.Equal(got, c.want) {
				t.Fatalf("Route = %v; want %v", got, c.want)
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
