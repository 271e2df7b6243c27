package fleet

import (
	"cmp"
	"hash/fnv"
	"math"
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

// Health is what fleetd's own forwards say of a model on a host.
type Health int

// The health classes. Route prefers Trial, then Healthy, Degraded and
// KeyRefused.
const (
	// Healthy: the recent answers succeed (or there are none). The zero value.
	Healthy Health = iota
	// Trial: an ejection for the model is over and no answer has tested the
	// host since: the next request goes there, and its answer decides.
	Trial
	// Degraded: too many recent answers failed (5xx or cut streams), or the
	// host's last poll timed out; it serves only when no healthy host can.
	Degraded
	// KeyRefused: the host refused the request's API key (401 or 403)
	// recently; it is tried last, whatever its state.
	KeyRefused
)

var healthNames = [...]string{Healthy: "healthy", Trial: "trial", Degraded: "degraded", KeyRefused: "key-refused"}

func (h Health) String() string { return healthNames[h] }

// preference orders health classes for Route, lower first.
func (h Health) preference() int {
	if h == Trial {
		return -1
	}
	return int(h)
}

// HostView is the routing input for one host that serves the model and is
// not ejected.
type HostView struct {
	Name   string
	Weight int // ties: higher first
	// Root is the canonical profile id the requested name resolves to there.
	Root string
	// Eligible lists the pools that may run Root; empty means every pool.
	Eligible []string
	Pools    []PoolView
	// Delta is, by profile id, this fleetd's requests to the host started
	// since its last poll minus those ended since (negative when requests
	// the poll counted have ended): the poll's counts plus Delta are the
	// host's load now, as far as this fleetd knows.
	Delta map[string]int
	// Wait is the host's recent queue wait for the model as fleetd saw it
	// (time to first byte); zero when unknown.
	Wait time.Duration
	// ITL is the recent mean gap between the chunks of the model's streams
	// from the host, as fleetd measured it; zero when unknown.
	ITL time.Duration
	// Health of the model on the host.
	Health Health
	// Claimed: a new copy of the model is claimed for this host (by this
	// fleetd or another replica): requests join it as if it were loading.
	Claimed bool
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
// load (ε = 0, no slack) and never scales out.
type RouteOptions struct {
	// ScaleOutWait, when positive, is the queue wait above which every awake
	// copy counts as overloaded (see Route).
	ScaleOutWait time.Duration
	// Epsilon bounds affinity by load: a host keeps its keys while its load,
	// with this request, is within (1+Epsilon)× the mean of its group.
	Epsilon float64
	// Slack is how many requests above the least loaded host of its group a
	// host may carry and still keep its keys, whatever the mean: at low load
	// a request more or less does not outweigh a warm prefix cache.
	Slack int
}

// Route orders the hosts that can serve a model, best first; forwarding tries
// them in that order. It is a pure function of its arguments.
//
// Hosts are grouped by health (Trial, Healthy, Degraded, KeyRefused: a
// host's success ratio, not its speed, decides between a failing host and a
// healthy one), then by the placement rank of their best eligible pool (see
// score), idle ones by their pool's last use (the least recently used
// first). Within a group, affinity is consistent hashing with bounded loads:
// each host's cost is its load scaled by how much slower its streams are
// than the group's fastest (ITL), and a host whose cost with this request
// stays within (1+Epsilon)× the group's mean (or within Slack of the least)
// is "within bound". Hosts within bound come first, by weight (higher
// first) and then by rendezvous hashing of the affinity key with the host's
// name, so that a session stays on its host until that host is overloaded,
// and only the keys of a host that leaves move. Hosts over the bound follow,
// the least cost first.
//
// Scale-out: when opts.ScaleOutWait is positive, the best host is awake, every
// awake host's Wait exceeds it, no copy is loading already, and some host has
// an asleep, empty or idle pool, the best such host goes first instead.
func Route(hosts []HostView, key string, opts RouteOptions) []Choice {
	type scored struct {
		Choice
		health   Health
		lastUsed time.Time
		cost     float64 // load scaled by relative slowness
		within   bool    // within the load bound: affinity decides
		weight   int
		hash     uint64
		wait     time.Duration
		itl      time.Duration
	}
	type group struct {
		health Health
		rank   placement.Rank
	}
	all := make([]scored, 0, len(hosts))
	for _, h := range hosts {
		c, ok := score(h)
		if !ok {
			continue
		}
		all = append(all, scored{Choice: Choice{Host: h.Name, Rank: c.Rank, Load: c.Load, Reason: c.Rank.String()},
			health: h.Health, lastUsed: c.LastUsed, weight: h.Weight, hash: affinityHash(key, h.Name), wait: h.Wait, itl: h.ITL})
	}
	groups := make(map[group][]int)
	for i, s := range all {
		g := group{s.health, s.Rank}
		groups[g] = append(groups[g], i)
	}
	for _, idx := range groups {
		fastest := time.Duration(0)
		for _, i := range idx {
			if itl := all[i].itl; itl > 0 && (fastest == 0 || itl < fastest) {
				fastest = itl
			}
		}
		total, least := 0.0, math.Inf(1)
		for _, i := range idx {
			slow := 1.0
			if fastest > 0 && all[i].itl > 0 {
				slow = float64(all[i].itl) / float64(fastest)
			}
			all[i].cost = float64(all[i].Load+1)*slow - 1
			total += all[i].cost
			least = min(least, all[i].cost)
		}
		bound := max(math.Ceil((1+opts.Epsilon)*(total+1)/float64(len(idx))), least+1+float64(opts.Slack))
		for _, i := range idx {
			all[i].within = all[i].cost+1 <= bound
		}
	}
	slices.SortFunc(all, func(a, b scored) int {
		if c := cmp.Or(cmp.Compare(a.health.preference(), b.health.preference()), cmp.Compare(a.Rank, b.Rank)); c != 0 {
			return c
		}
		if a.Rank == placement.Idle {
			if c := a.lastUsed.Compare(b.lastUsed); c != 0 {
				return c
			}
		}
		if a.within != b.within {
			if a.within {
				return -1
			}
			return 1
		}
		cost := 0
		if !a.within {
			cost = cmp.Compare(a.cost, b.cost)
		}
		return cmp.Or(cost, cmp.Compare(b.weight, a.weight), cmp.Compare(b.hash, a.hash), cmp.Compare(a.Host, b.Host))
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
				if spare < 0 && s.health == Healthy {
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
// idle grace (fleetd does not know the host's), and with this fleetd's
// requests since the poll (Delta) added to its loaded profile's in-flight
// count. Requests for the model sent since the poll, or a claim of a new
// copy there, turn an asleep, empty, idle or queueing host into a loading
// one: they woke, started or queued for the model there, and the requests
// that follow should join them (one load per cold burst).
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
		if p.Profile != "" {
			in.InFlight = max(0, in.InFlight+h.Delta[p.Profile])
		}
		c := placement.Of(in, h.Root, time.Time{}, 0)
		if !found || placement.Compare(c, best) < 0 {
			best, found = c, true
		}
	}
	if !found {
		return best, false
	}
	if sent := h.Delta[h.Root]; best.Rank > placement.Loading && (sent > 0 || h.Claimed) {
		best.Rank = placement.Loading
		best.Load += max(0, sent)
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
