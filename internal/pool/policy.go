package pool

import "time"

// DefaultIdleGrace is how long after its last request the loaded profile still
// counts as in demand, when the grace is fixed; it bridges the gap between the
// requests of a closed-loop client, so that such a client keeps its model for
// the minimum residency.
const DefaultIdleGrace = time.Second

// DefaultGraceFloor is the least idle grace a learned one may be (see
// Policy.LearnGrace), and the grace of a profile whose gaps are not known
// yet: a lone client that alternates models swaps at once.
const DefaultGraceFloor = 20 * time.Millisecond

// A learned grace is graceFactor times the moving average of the profile's
// gaps, a new gap weighing gapWeight in it.
const (
	graceFactor = 2
	gapWeight   = 0.3
)

// DefaultPriorityAge is how much waiting time one priority level is worth: a waiter
// of priority p behaves as if it had arrived p×DefaultPriorityAge earlier.
const DefaultPriorityAge = time.Minute

// DefaultBackgroundAge is how long a background tenant's request waits
// behind other tenants' before it competes with them as an equal.
const DefaultBackgroundAge = 5 * time.Second

// Policy holds one pool's scheduling settings. Zero durations disable the
// corresponding rule; a zero MaxQueue means no bound.
type Policy struct {
	// MinResidency is how long a freshly loaded profile keeps the pool while it
	// still has demand, before waiters for other profiles close the gate.
	MinResidency time.Duration
	// Residency overrides MinResidency for the profiles it lists (a profile's
	// own minResidency); nil or a missing profile means MinResidency.
	Residency map[string]time.Duration
	// IdleGrace is how long after its last use the loaded profile counts as
	// in demand; with LearnGrace, the least a learned grace may be.
	IdleGrace time.Duration
	// LearnGrace learns each profile's grace from its own clients instead:
	// the gaps between one request's end and the next one's arrival while
	// nothing else ran (a closed-loop client's think time), graceFactor
	// times their moving average, between IdleGrace and the profile's
	// residency. A profile with no gap seen yet has IdleGrace.
	LearnGrace bool
	// PriorityAge is the waiting time one priority level is worth.
	PriorityAge time.Duration
	// MaxQueue bounds the number of waiting requests.
	MaxQueue int
	// MaxInFlight is, per profile, the admission ceiling of its engine:
	// requests beyond it wait in the pool's queue, not the engine's, and
	// are admitted as leases end, by weighted fair queueing over their
	// tenants (see Waiter.Tenant). A profile missing, or at zero, has none.
	MaxInFlight map[string]int
	// BackgroundAge is how long a background tenant's request may wait
	// before it counts as any other: background tenants are served when no
	// other waits, and never starved. Zero: they age at once.
	BackgroundAge time.Duration
	// IdleTimeout is, per profile, how long its engine stays once no
	// request is in flight or queued, before the pool releases it; a
	// profile missing, or at zero, stays until another is wanted.
	IdleTimeout map[string]time.Duration
	// MaxKeepAlive bounds, per profile, the keep-alive a request may ask
	// for (KeepAlive); a profile missing, or at zero, has no bound.
	MaxKeepAlive map[string]time.Duration
}

// KeepAlive is how long a request asks its engine be kept once its answer
// ends (Ollama's keep_alive). The zero value asks nothing: the profile's
// idle timeout holds.
type KeepAlive struct {
	// Set reports that the request asked; D is what it asked for:
	// negative, as long as allowed; zero, a release at once.
	Set bool
	D   time.Duration
}

// stay is how long profile's engine stays idle after a request that asked
// k, bounded by MaxKeepAlive; forever when no release is due.
func (p Policy) stay(profile string, k KeepAlive) (d time.Duration, forever bool) {
	bound := p.MaxKeepAlive[profile]
	switch {
	case !k.Set:
		d = p.IdleTimeout[profile]
		return d, d <= 0
	case k.D < 0:
		return bound, bound <= 0
	case bound > 0:
		return min(k.D, bound), false
	}
	return k.D, false
}

// ceiling is profile's admission ceiling; zero: none.
func (p Policy) ceiling(profile string) int { return p.MaxInFlight[profile] }

// residency is how long profile keeps the pool once loaded.
func (p Policy) residency(profile string) time.Duration {
	if d, ok := p.Residency[profile]; ok {
		return d
	}
	return p.MinResidency
}
