package fleet

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"
)

// Tier ranks how cheaply a host can serve a model now; lower is better.
type Tier int

// The tiers, best first.
const (
	// TierAwake: a pool has the model loaded and admits requests for it.
	TierAwake Tier = iota + 1
	// TierLoading: a pool is loading the model (requests wait for it there).
	TierLoading
	// TierAsleep: a pool holds the model asleep (sleep mode); waking is fast.
	TierAsleep
	// TierIdle: an eligible pool has nothing in flight and nothing waiting, so
	// loading the model there disturbs nobody.
	TierIdle
	// TierQueue: only busy eligible pools; the request queues for a swap.
	TierQueue
)

var tierReasons = [...]string{TierAwake: "awake", TierLoading: "loading", TierAsleep: "asleep", TierIdle: "idle", TierQueue: "queue"}

func (t Tier) String() string { return tierReasons[t] }

// ReasonScaleOut is the reason of a decision that sends a request to an idle
// or sleeping pool although the model is awake elsewhere, because every awake
// copy's queue wait is over the scale-out threshold.
const ReasonScaleOut = "scale-out"

// PoolView is the routing input for one pool of a host, from its /status.
type PoolView struct {
	Name        string
	State       string // empty|starting|ready|draining|stopping|sleeping|failed
	Profile     string // loaded profile id; "" when none
	SwitchingTo string // profile being loaded; "" when none
	// GateClosed is set while the pool drains towards a swap: requests for
	// its loaded profile queue instead of being admitted.
	GateClosed bool
	InFlight   int
	Waiting    int      // all waiting requests, whatever their profile
	Sleeping   []string // profiles asleep in the pool
}

// HostView is the routing input for one healthy host that serves the model.
type HostView struct {
	Name   string
	Weight int // ties: higher first
	// Root is the canonical profile id the requested name resolves to there.
	Root string
	// Eligible lists the pools that may run Root; empty means every pool.
	Eligible []string
	Pools    []PoolView
	// Local counts this fleetd's own requests in flight to the host, by
	// profile id: they cover the gap until the next poll shows them.
	Local map[string]int
	// Wait is the host's recent queue wait for the model as fleetd saw it
	// (time to first byte); zero when unknown.
	Wait time.Duration
}

// Choice is one host in a routing order.
type Choice struct {
	Host string
	Tier Tier
	// Load is in-flight plus waiting requests on the pool chosen within the host.
	Load int
	// Reason is Tier's name, or ReasonScaleOut.
	Reason string
}

// RouteOptions are the routing settings. The zero value routes strictly by
// load and never scales out.
type RouteOptions struct {
	// ScaleOutWait, when positive, is the queue wait above which every awake
	// copy counts as overloaded (see Route).
	ScaleOutWait time.Duration
	// Slack is how many requests a host's load may exceed the least load of
	// its tier and still count as tied, so that weight and affinity decide:
	// a request more or less does not outweigh a warm prefix cache.
	Slack int
}

// Route orders the hosts that can serve a model, best first; forwarding tries
// them in that order. It is a pure function of its arguments.
//
// Each host is scored by its best eligible pool (see score). Hosts are then
// ordered by tier, by load within the tier (loads within opts.Slack of the
// tier's least count as equal), by weight (higher first), and last by
// rendezvous hashing of the affinity key with the host's name, so that
// requests sharing a key land on the same host among equals, and only the
// keys of a host that leaves move elsewhere.
//
// Scale-out: when opts.ScaleOutWait is positive, the best host is awake, every
// awake host's Wait exceeds it, no copy is loading already, and some host has
// an asleep or idle pool, the best such host goes first instead.
func Route(hosts []HostView, key string, opts RouteOptions) []Choice {
	type scored struct {
		Choice
		rank   int // Load, or 0 when within Slack of the tier's least
		weight int
		hash   uint64
		wait   time.Duration
	}
	all := make([]scored, 0, len(hosts))
	least := make(map[Tier]int)
	for _, h := range hosts {
		tier, load := score(h)
		if tier == 0 {
			continue
		}
		if l, ok := least[tier]; !ok || load < l {
			least[tier] = load
		}
		all = append(all, scored{Choice: Choice{Host: h.Name, Tier: tier, Load: load, Reason: tier.String()}, rank: load, weight: h.Weight, hash: affinityHash(key, h.Name), wait: h.Wait})
	}
	for i := range all {
		if all[i].Load <= least[all[i].Tier]+opts.Slack {
			all[i].rank = 0
		}
	}
	slices.SortFunc(all, func(a, b scored) int {
		return cmp.Or(
			cmp.Compare(a.Tier, b.Tier),
			cmp.Compare(a.rank, b.rank),
			cmp.Compare(b.weight, a.weight),
			cmp.Compare(b.hash, a.hash),
			cmp.Compare(a.Host, b.Host),
		)
	})
	if opts.ScaleOutWait > 0 && len(all) > 0 && all[0].Tier == TierAwake {
		overloaded, spare := true, -1
		for i, s := range all {
			switch s.Tier {
			case TierAwake:
				overloaded = overloaded && s.wait > opts.ScaleOutWait
			case TierLoading:
				overloaded = false // a copy is coming up already
			case TierAsleep, TierIdle:
				if spare < 0 {
					spare = i
				}
			}
		}
		if overloaded && spare > 0 {
			s := all[spare]
			s.Reason = ReasonScaleOut
			copy(all[1:spare+1], all[:spare])
			all[0] = s
		}
	}
	out := make([]Choice, len(all))
	for i, s := range all {
		out[i] = s.Choice
	}
	return out
}

// score returns a host's tier for its model and the load of the pool that
// gives it, or tier 0 when no pool of the host may run the model.
//
// A pool is awake when the model is loaded and its gate open; loading when
// the model is being loaded into it; asleep when the model sleeps in it; idle
// when nothing is in flight or waiting and it is not in the middle of a swap;
// otherwise it queues. Load is in-flight plus waiting. The fleetd-local
// in-flight counts cover what the last poll has not seen yet: those for a
// pool's loaded profile raise its load (a pool they keep busy is not idle),
// and those for the model turn an asleep or idle host into a loading one,
// since they woke or started the model there.
func score(h HostView) (Tier, int) {
	var best Tier
	load := 0
	for _, p := range h.Pools {
		if len(h.Eligible) > 0 && !slices.Contains(h.Eligible, p.Name) {
			continue
		}
		l := p.InFlight + p.Waiting
		if p.Profile != "" {
			l = max(l, h.Local[p.Profile])
		}
		var t Tier
		switch {
		case p.Profile == h.Root && p.State == "ready" && !p.GateClosed:
			t = TierAwake
		case p.SwitchingTo == h.Root:
			t = TierLoading
		case slices.Contains(p.Sleeping, h.Root):
			t = TierAsleep
		case l == 0 && p.SwitchingTo == "" && p.State != "draining" && p.State != "stopping":
			t = TierIdle
		default:
			t = TierQueue
		}
		if best == 0 || t < best || t == best && l < load {
			best, load = t, l
		}
	}
	if best == 0 {
		return 0, 0
	}
	if local := h.Local[h.Root]; local > 0 {
		if best == TierAsleep || best == TierIdle {
			best = TierLoading
		}
		load = max(load, local)
	}
	return best, load
}

// affinityHash is the rendezvous weight of host for key: FNV-1a of both.
func affinityHash(key, host string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(host))
	return h.Sum64()
}
