package profile

import (
	"maps"
	"slices"
	"time"
)

// applyDefaults fills every unset field of a validated c.
func (c *Config) applyDefaults() {
	d := &c.Defaults
	for _, p := range c.Pools {
		p.MinResidency = p.MinResidency.or(d.MinResidency, DefaultMinResidency)
		p.MaxQueueWait = p.MaxQueueWait.or(d.MaxQueueWait, DefaultMaxQueueWait)
		if p.MaxQueue == 0 {
			p.MaxQueue = d.MaxQueue
		}
		if p.MaxQueue == 0 {
			p.MaxQueue = DefaultMaxQueue
		}
		if p.MaxSleeping == 0 {
			p.MaxSleeping = DefaultMaxSleeping
		}
	}
	for _, p := range c.Profiles {
		p.StartupTimeout = p.StartupTimeout.or(d.StartupTimeout, DefaultStartupTimeout)
		p.StopTimeout = p.StopTimeout.or(d.StopTimeout, DefaultStopTimeout)
		p.IdleTimeout = p.IdleTimeout.or(d.IdleTimeout, 0)
		p.MaxKeepAlive = p.MaxKeepAlive.or(d.MaxKeepAlive, p.IdleTimeout.Duration)
		if len(d.Env) > 0 {
			env := maps.Clone(d.Env)
			maps.Copy(env, p.Env)
			p.Env = env
		}
		for _, n := range d.PassEnv {
			if !slices.Contains(p.PassEnv, n) {
				p.PassEnv = append(p.PassEnv, n)
			}
		}
		if len(p.Pools) == 0 {
			p.Pools = make([]string, len(c.Pools))
			for i, pool := range c.Pools {
				p.Pools[i] = pool.Name
			}
		}
	}
}

// index builds the name lookups of a validated c.
func (c *Config) index() {
	c.pools = make(map[string]*PoolSpec, len(c.Pools))
	for _, p := range c.Pools {
		c.pools[p.Name] = p
	}
	c.names = make(map[string]*Profile)
	for _, p := range c.Profiles {
		c.names[p.ID] = p
		for _, a := range p.Aliases {
			c.names[a] = p
		}
	}
	c.sorted = slices.Sorted(maps.Keys(c.names))
}

// Lookup returns the profile whose id or alias is name, or nil if there is none.
func (c *Config) Lookup(name string) *Profile {
	if c == nil {
		return nil
	}
	return c.names[name]
}

// Pool returns the pool called name, or nil if there is none.
func (c *Config) Pool(name string) *PoolSpec {
	if c == nil {
		return nil
	}
	return c.pools[name]
}

// Names returns every servable name, ids and aliases alike, sorted. The caller may
// modify the returned slice.
func (c *Config) Names() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.sorted)
}

// EligibleOn reports whether p may run on the pool called pool. A profile with no
// Pools is eligible everywhere (after Parse, Pools lists every pool instead).
func (p *Profile) EligibleOn(pool string) bool {
	return len(p.Pools) == 0 || slices.Contains(p.Pools, pool)
}

// Equal reports whether p and q define the same profile. Durations compare by value,
// nil and empty lists and maps are equal.
func (p *Profile) Equal(q *Profile) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.ID == q.ID &&
		slices.Equal(p.Aliases, q.Aliases) &&
		p.Model == q.Model &&
		slices.Equal(p.Pools, q.Pools) &&
		p.MaxModelLen == q.MaxModelLen &&
		slices.Equal(p.Args, q.Args) &&
		maps.Equal(p.Env, q.Env) &&
		slices.Equal(p.PassEnv, q.PassEnv) &&
		slices.Equal(p.Command, q.Command) &&
		p.StartupTimeout.Duration == q.StartupTimeout.Duration &&
		p.StopTimeout.Duration == q.StopTimeout.Duration &&
		p.Priority == q.Priority &&
		p.MaxInFlight == q.MaxInFlight &&
		sameOverride(p.MinResidency, q.MinResidency) &&
		sameOverride(p.MaxQueueWait, q.MaxQueueWait) &&
		p.IdleTimeout.Duration == q.IdleTimeout.Duration &&
		p.MaxKeepAlive.Duration == q.MaxKeepAlive.Duration &&
		p.SleepLevel() == q.SleepLevel() &&
		p.WeightBytes == q.WeightBytes
}

// sameOverride compares two optional settings: both unset, or both set to the
// same value (an explicit "0s" is not unset).
func sameOverride(a, b Duration) bool {
	return a.IsZero() == b.IsZero() && a.Duration == b.Duration
}

// Residency is how long p keeps pool once loaded: p's own minResidency when
// set, else for a sleep-enabled profile the pool's capped at
// DefaultSleepMinResidency (a wake is cheap), else the pool's. The second
// result reports whether it differs from the pool's own rule: p sets its own
// or sleeps.
func (p *Profile) Residency(pool *PoolSpec) (time.Duration, bool) {
	switch {
	case !p.MinResidency.IsZero():
		return p.MinResidency.Duration, true
	case p.Sleep != nil:
		return min(pool.MinResidency.Duration, DefaultSleepMinResidency), true
	}
	return pool.MinResidency.Duration, false
}

// QueueWait is how long a request for p may wait on pool: p's own
// maxQueueWait when set, else the pool's.
func (p *Profile) QueueWait(pool *PoolSpec) time.Duration {
	if !p.MaxQueueWait.IsZero() {
		return p.MaxQueueWait.Duration
	}
	return pool.MaxQueueWait.Duration
}
