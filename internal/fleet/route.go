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
// copy is saturated.
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
	Waiting    int            // all waiting requests, whatever their profile
	Queued     map[string]int // the requests waiting in poold's queue, by profile
	Sleeping   []string       // profiles asleep in the pool
	LastUsed   time.Time
	// Engine is what the pool's awake engine last said of its load (poold's
	// engineStats); nil when the host sent none.
	Engine *EngineLoad
}

// EngineLoad is an engine's own report of its load, as its host relays it.
type EngineLoad struct {
	// Running and Waiting are the requests in the engine's batch and in its
	// own queue.
	Running, Waiting int
	// KVCacheUsage is the share of the engine's KV cache in use, 0 to 1.
	KVCacheUsage float64
	// SampledAt is when the engine was read, on fleetd's clock.
	SampledAt time.Time
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
	// Load is the requests on the pool chosen within the host: for an awake
	// copy with a fresh engine sample, those its engine runs and queues (or
	// poold's in flight, when more) plus those waiting for the model in
	// poold's queue; else poold's in-flight plus waiting requests. Either way with this fleetd's requests since
	// the host's poll.
	Load int
	// Saturated: the chosen pool is an awake copy past a saturation
	// threshold (RouteOptions.Saturation).
	Saturated bool
	// Reason is Rank's name, or ReasonScaleOut.
	Reason string
}

// Saturation holds the thresholds past which an awake copy of a model is
// saturated: its engine's KV cache use above KVCacheUsage, or more than
// Waiting requests for the model waiting there, in the engine's own queue
// and in poold's together (poold keeps the requests past a profile's
// admission ceiling in its own queue, where the engine does not see them).
// A zero threshold is never passed.
type Saturation struct {
	KVCacheUsage float64
	Waiting      int
}

// over reports whether an engine at kv KV cache use with waiting requests
// queued is past a threshold.
func (s Saturation) over(kv float64, waiting int) bool {
	return s.KVCacheUsage > 0 && kv > s.KVCacheUsage || s.Waiting > 0 && waiting > s.Waiting
}

// RouteOptions are the routing settings. The zero value routes strictly by
// load (ε = 0, no slack) with every engine sample, counts no copy
// saturated, and never scales out.
type RouteOptions struct {
	// Saturation says when an awake copy is saturated: it gets requests only
	// when no unsaturated copy can take them.
	Saturation Saturation
	// StatsMaxAge, when positive, is the age at Now past which an engine's
	// sample is ignored: that copy is weighed by poold's lease counts
	// instead, and saturated only by poold's queue.
	StatsMaxAge time.Duration
	Now         time.Time
	// ScaleOut: when every awake copy is saturated, a host that would load
	// another goes first (see Route).
	ScaleOut bool
	// MaxCopies, when positive, is the most awake copies of the model
	// scale-out brings it to.
	MaxCopies int
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
// first), and awake ones by saturation: a saturated copy comes after every
// unsaturated one of its health, whatever its sessions. Within a group,
// affinity is consistent hashing with bounded loads: each host's cost is
// its load scaled by how much slower its streams are than the group's
// fastest (ITL), and a host whose cost with this request stays within
// (1+Epsilon)× the group's mean (or within Slack of the least) is "within
// bound". Hosts within bound come first, by weight (higher first) and then
// by rendezvous hashing of the affinity key with the host's name, so that a
// session stays on its host until that host is overloaded, and only the
// keys of a host that leaves move. Hosts over the bound follow, the least
// cost first, then the least KV cache use, then the shortest queue for the
// model in poold.
//
// Scale-out: when opts.ScaleOut is set, the best host is awake, every awake
// host is saturated, no copy is loading already, fewer than opts.MaxCopies
// copies are awake (when it is positive), and some healthy host has an
// asleep, empty or idle pool, the best such host goes first instead.
func Route(hosts []HostView, key string, opts RouteOptions) []Choice {
	type scored struct {
		Choice
		health   Health
		lastUsed time.Time
		kv       float64
		queued   int
		cost     float64 // load scaled by relative slowness
		within   bool    // within the load bound: affinity decides
		weight   int
		hash     uint64
		itl      time.Duration
	}
	type group struct {
		health    Health
		rank      placement.Rank
		saturated bool
	}
	all := make([]scored, 0, len(hosts))
	for _, h := range hosts {
		c, ok := score(h, opts)
		if !ok {
			continue
		}
		all = append(all, scored{Choice: Choice{Host: h.Name, Rank: c.Rank, Load: c.Load, Saturated: c.saturated, Reason: c.Rank.String()},
			health: h.Health, lastUsed: c.LastUsed, kv: c.kv, queued: c.queued, weight: h.Weight, hash: affinityHash(key, h.Name), itl: h.ITL})
	}
	groups := make(map[group][]int)
	for i, s := range all {
		g := group{s.health, s.Rank, s.Saturated}
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
		if c := cmp.Or(cmp.Compare(a.health.preference(), b.health.preference()), cmp.Compare(a.Rank, b.Rank),
			falseFirst(a.Saturated, b.Saturated)); c != 0 {
			return c
		}
		if a.Rank == placement.Idle {
			if c := a.lastUsed.Compare(b.lastUsed); c != 0 {
				return c
			}
		}
		if c := falseFirst(!a.within, !b.within); c != 0 {
			return c
		}
		byLoad := 0
		if !a.within {
			byLoad = cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.kv, b.kv), cmp.Compare(a.queued, b.queued))
		}
		return cmp.Or(byLoad, cmp.Compare(b.weight, a.weight), cmp.Compare(b.hash, a.hash), cmp.Compare(a.Host, b.Host))
	})
	if opts.ScaleOut && len(all) > 0 && all[0].Rank == placement.Awake {
		saturated, copies, spare := true, 0, -1
		for i, s := range all {
			switch s.Rank {
			case placement.Awake:
				copies++
				saturated = saturated && s.Saturated
			case placement.Loading:
				saturated = false // a copy is coming up already
			case placement.Asleep, placement.Empty, placement.Idle:
				if spare < 0 && s.health == Healthy {
					spare = i
				}
			}
		}
		if saturated && spare > 0 && (opts.MaxCopies <= 0 || copies < opts.MaxCopies) {
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

// falseFirst orders false before true.
func falseFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// poolLoad is a pool's placement for a model, with what else Route weighs
// it by.
type poolLoad struct {
	placement.Candidate
	kv        float64 // the engine's KV cache use: an awake copy with a fresh sample only
	queued    int     // requests for the model in poold's queue: an awake copy only
	saturated bool
}

// score returns the placement of a host's best eligible pool for its model,
// and false when no pool of the host may run the model.
//
// Each pool is ranked by placement.Of from what its /status says, with no
// idle grace (fleetd does not know the host's), and with this fleetd's
// requests since the poll (Delta) added to its loaded profile's in-flight
// count; an awake copy is then weighed by weigh, and an unsaturated one
// goes before a saturated one. Requests for the model sent since the poll,
// or a claim of a new copy there, turn an asleep, empty, idle or queueing
// host into a loading one: they woke, started or queued for the model
// there, and the requests that follow should join them (one load per cold
// burst).
func score(h HostView, opts RouteOptions) (poolLoad, bool) {
	var best poolLoad
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
			Queued:     p.Queued[h.Root] > 0,
			Asleep:     slices.Contains(p.Sleeping, h.Root),
			InFlight:   p.InFlight,
			Waiting:    p.Waiting,
			LastUsed:   p.LastUsed,
		}
		if p.Profile != "" {
			in.InFlight = max(0, in.InFlight+h.Delta[p.Profile])
		}
		c := poolLoad{Candidate: placement.Of(in, h.Root, time.Time{}, 0)}
		if c.Rank == placement.Awake {
			c.weigh(p, in.InFlight, h.Delta[p.Profile], opts)
		}
		if !found || c.compare(best) < 0 {
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

// weigh sets the load of awake copy p, with inFlight requests in poold now
// (as far as this fleetd knows), to which this fleetd sent sent requests
// since the poll (fewer when negative), and whether it is saturated. A
// fresh engine sample counts the requests the engine runs and queues, or
// poold's in flight when more (the sample may be a second older than the
// poll), and those poold queues for the model in front of it; without one
// the load stays poold's in flight plus waiting (placement.Of's), and only
// poold's queue can saturate the copy.
func (c *poolLoad) weigh(p PoolView, inFlight, sent int, opts RouteOptions) {
	c.queued = p.Queued[p.Profile]
	waiting := c.queued
	if e := p.Engine; e != nil && (opts.StatsMaxAge <= 0 || opts.Now.Sub(e.SampledAt) <= opts.StatsMaxAge) {
		c.Load = max(max(0, e.Running+sent)+e.Waiting, inFlight) + c.queued
		c.kv = e.KVCacheUsage
		waiting += e.Waiting
	}
	c.saturated = opts.Saturation.over(c.kv, waiting)
}

// compare orders two pools of a host, the better first: by placement, and
// within a rank an unsaturated copy first.
func (c poolLoad) compare(o poolLoad) int {
	if c.Rank == o.Rank {
		if s := falseFirst(c.saturated, o.saturated); s != 0 {
			return s
		}
	}
	return placement.Compare(c.Candidate, o.Candidate)
}

// affinityHash is the rendezvous weight of host for key: FNV-1a of both.
func affinityHash(key, host string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(host))
	return h.Sum64()
}
