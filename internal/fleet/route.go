package fleet

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"

	"github.com/poold/poold/internal/placement"
)

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
	Queued     []string // the profiles requests wait for
	Sleeping   []string // profiles asleep in the pool
	LastUsed   time.Time
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
	// Rank is the host's best pool's rank for the model.
	Rank placement.Rank
	// Load is in-flight plus waiting requests on the pool chosen within the host.
	Load int
	// Reason is Rank's name, or ReasonScaleOut.
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
// Each host is scored by its best eligible pool (see score), by the shared
// placement order (package placement). Hosts are then ordered by rank, idle
// ones by their pool's last use (the least recently used first), by load
// within the rank (loads within opts.Slack of the rank's least count as
// equal), by weight (higher first), and last by rendezvous hashing of the
// affinity key with the host's name, so that requests sharing a key land on
// the same host among equals, and only the keys of a host that leaves move
// elsewhere.
//
// Scale-out: when opts.ScaleOutWait is positive, the best host is awake, every
// awake host's Wait exceeds it, no copy is loading already, and some host has
// an asleep, empty or idle pool, the best such host goes first instead.
func Route(hosts []HostView, key string, opts RouteOptions) []Choice {
	type scored struct {
		Choice
		lastUsed time.Time
		load     int // Load, or 0 when within Slack of the rank's least
		weight   int
		hash     uint64
		wait     time.Duration
	}
	all := make([]scored, 0, len(hosts))
	least := make(map[placement.Rank]int)
	for _, h := range hosts {
		c, ok := score(h)
		if !ok {
			continue
		}
		if l, ok := least[c.Rank]; !ok || c.Load < l {
			least[c.Rank] = c.Load
		}
		all = append(all, scored{Choice: Choice{Host: h.Name, Rank: c.Rank, Load: c.Load, Reason: c.Rank.String()},
			lastUsed: c.LastUsed, load: c.Load, weight: h.Weight, hash: affinityHash(key, h.Name), wait: h.Wait})
	}
	for i := range all {
		if all[i].Load <= least[all[i].Rank]+opts.Slack {
			all[i].load = 0
		}
	}
	slices.SortFunc(all, func(a, b scored) int {
		idle := 0
		if a.Rank == placement.Idle && b.Rank == placement.Idle {
			idle = a.lastUsed.Compare(b.lastUsed)
		}
		return cmp.Or(
			cmp.Compare(a.Rank, b.Rank),
			idle,
			cmp.Compare(a.load, b.load),
			cmp.Compare(b.weight, a.weight),
			cmp.Compare(b.hash, a.hash),
			cmp.Compare(a.Host, b.Host),
		)
	})
	if opts.ScaleOutWait > 0 && len(all) > 0 && all[0].Rank == placement.Awake {
		overloaded, spare := true, -1
		for i, s := range all {
			switch s.Rank {
			case placement.Awake:
				overloaded = overloaded && s.wait > opts.ScaleOutWait
			case placement.Loading:
				overloaded = false // a copy is coming up already
			case placement.Asleep, placement.Empty, placement.Idle:
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

// score returns the placement of a host's best eligible pool for its model,
// and false when no pool of the host may run the model.
//
// Each pool is ranked by placement.Of from what its /status says, with no
// idle grace (fleetd does not know the host's). The fleetd-local in-flight
// counts cover what the last poll has not seen yet: those for a pool's
// loaded profile raise its load (a pool they keep busy is not idle), and
// those for the model turn an asleep, empty or idle host into a loading one,
// since they woke or started the model there.
func score(h HostView) (placement.Candidate, bool) {
	var best placement.Candidate
	found := false
	for _, p := range h.Pools {
		if len(h.Eligible) > 0 && !slices.Contains(h.Eligible, p.Name) {
			continue
		}
		in := placement.Pool{
			Loaded:     p.Profile,
			Target:     p.SwitchingTo,
			Swapping:   p.SwitchingTo != "" || p.State == "starting" || p.State == "stopping" || p.State == "sleeping",
			GateClosed: p.GateClosed,
			Queued:     slices.Contains(p.Queued, h.Root),
			Asleep:     slices.Contains(p.Sleeping, h.Root),
			InFlight:   p.InFlight,
			Waiting:    p.Waiting,
			LastUsed:   p.LastUsed,
		}
		if extra := h.Local[p.Profile] - (p.InFlight + p.Waiting); p.Profile != "" && extra > 0 {
			in.InFlight += extra
		}
		c := placement.Of(in, h.Root, time.Time{}, 0)
		if !found || placement.Compare(c, best) < 0 {
			best, found = c, true
		}
	}
	if !found {
		return best, false
	}
	if local := h.Local[h.Root]; local > 0 {
		switch best.Rank {
		case placement.Asleep, placement.Empty, placement.Idle:
			best.Rank = placement.Loading
		}
		best.Load = max(best.Load, local)
	}
	return best, true
}

// affinityHash is the rendezvous weight of host for key: FNV-1a of both.
func affinityHash(key, host string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(host))
	return h.Sum64()
}
