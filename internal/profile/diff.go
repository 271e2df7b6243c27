package profile

import (
	"slices"
)

// Changes is what one profiles file changes from another, by name; each
// list is in file order (the removed ones in the old file's). The zero
// value changes nothing.
type Changes struct {
	ProfilesAdded, ProfilesRemoved, ProfilesChanged []string // profile ids
	PoolsAdded, PoolsRemoved, PoolsChanged          []string // pool names
	// PoolsAffected are the pools that were added, removed or changed, or
	// on which a profile that was added, removed or changed may run (before
	// or after).
	PoolsAffected []string
	// SleepMemoryBudget reports a change of defaults.sleepMemoryBudget, the
	// one default that is not a pool's or a profile's.
	SleepMemoryBudget bool
}

// None reports whether c changes nothing.
func (c Changes) None() bool {
	return len(c.ProfilesAdded)+len(c.ProfilesRemoved)+len(c.ProfilesChanged)+len(c.PoolsAffected) == 0 && !c.SleepMemoryBudget
}

// Diff compares two profiles files as applied (defaults filled in): a
// default that changes shows as a change of the pools or profiles it
// applies to. A nil Config has nothing.
func Diff(old, cur *Config) Changes {
	if old == nil {
		old = &Config{}
	}
	if cur == nil {
		cur = &Config{}
	}
	var c Changes
	affected := make(map[string]bool)
	touch := func(p *Profile, pools []*PoolSpec) {
		for _, pool := range pools {
			if p.EligibleOn(pool.Name) {
				affected[pool.Name] = true
			}
		}
	}
	oldPools, curPools := old.Pools, cur.Pools
	for _, p := range cur.Profiles {
		switch q := old.Lookup(p.ID); {
		case q == nil || q.ID != p.ID:
			c.ProfilesAdded = append(c.ProfilesAdded, p.ID)
		case !p.Equal(q):
			c.ProfilesChanged = append(c.ProfilesChanged, p.ID)
			touch(q, oldPools)
		default:
			continue
		}
		touch(p, curPools)
	}
	for _, q := range old.Profiles {
		if p := cur.Lookup(q.ID); p == nil || p.ID != q.ID {
			c.ProfilesRemoved = append(c.ProfilesRemoved, q.ID)
			touch(q, oldPools)
		}
	}
	for _, s := range curPools {
		switch o := old.Pool(s.Name); {
		case o == nil:
			c.PoolsAdded = append(c.PoolsAdded, s.Name)
		case !s.Equal(o):
			c.PoolsChanged = append(c.PoolsChanged, s.Name)
		default:
			continue
		}
		affected[s.Name] = true
	}
	for _, o := range oldPools {
		if cur.Pool(o.Name) == nil {
			c.PoolsRemoved = append(c.PoolsRemoved, o.Name)
			affected[o.Name] = true
		}
	}
	// In file order: the new file's pools, then those only the old one had.
	for _, s := range append(slices.Clip(curPools), oldPools...) {
		if affected[s.Name] {
			c.PoolsAffected = append(c.PoolsAffected, s.Name)
			delete(affected, s.Name)
		}
	}
	c.SleepMemoryBudget = old.Defaults.SleepMemoryBudget != cur.Defaults.SleepMemoryBudget
	return c
}

// Equal reports whether s and o define the same pool. Durations compare by
// value.
func (s *PoolSpec) Equal(o *PoolSpec) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Name == o.Name &&
		slices.Equal(s.GPUs, o.GPUs) &&
		s.Default == o.Default &&
		s.MinResidency.Duration == o.MinResidency.Duration &&
		s.MaxQueue == o.MaxQueue &&
		s.MaxQueueWait.Duration == o.MaxQueueWait.Duration &&
		s.MaxSleeping == o.MaxSleeping &&
		s.AllowNonLoopback == o.AllowNonLoopback
}
