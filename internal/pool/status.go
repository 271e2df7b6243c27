package pool

import (
	"slices"

	"github.com/poold/poold/internal/statusapi"
)

// Status snapshots every pool, in file order: what /status shows of them,
// less what other parts of poold add: their engines' stats (package
// enginestats) and their GPUs' memory (FillGPUMemory).
func (s *Set) Status() []statusapi.Pool {
	ps := s.Pools()
	out := make([]statusapi.Pool, len(ps))
	for i, p := range ps {
		out[i] = p.Status()
	}
	return out
}

// FillGPUMemory gives each pool's snapshot the memory of its GPUs among
// devices (those that telemetry could read).
func FillGPUMemory(pools []statusapi.Pool, devices []statusapi.GPU) {
	for i := range pools {
		for _, idx := range pools[i].GPUs {
			if j := slices.IndexFunc(devices, func(g statusapi.GPU) bool { return g.Index == idx }); j >= 0 {
				g := devices[j]
				pools[i].GPUMemory = append(pools[i].GPUMemory, statusapi.GPUMemory{Index: g.Index, UsedBytes: g.MemoryUsedBytes, TotalBytes: g.MemoryTotalBytes})
			}
		}
	}
}

// Status returns a consistent snapshot of the pool.
func (p *Pool) Status() statusapi.Pool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.Now()
	s := &p.sched
	waiting, oldest := s.Waiting()
	st := statusapi.Pool{
		Name:      p.name,
		GPUs:      p.spec.GPUs,
		State:     p.state.String(),
		Profile:   strPtr(s.Loaded()),
		InFlight:  s.InFlight(),
		Waiting:   waiting,
		Gate:      "open",
		LastUsed:  s.LastUsed(),
		Since:     p.since,
		Sleeping:  p.sleepStatusLocked(),
		GPUMemory: []statusapi.GPUMemory{},
		Adoption:  slices.Clone(p.adoption),
	}
	if t := s.Target(); t != "" {
		st.SwitchingTo = &t
	}
	if at, ok := s.ReleaseAt(); ok {
		st.ReleaseAt, st.ReleaseAction = &at, statusapi.ReleaseStop
		if prof := p.cfg.Lookup(s.Loaded()); prof != nil && prof.SleepLevel() > 0 && p.spec.MaxSleeping > 0 && p.reload.step != reloadRetire {
			st.ReleaseAction = statusapi.ReleaseSleep
		}
	}
	if p.reload.step == reloadRetire && p.eng != nil {
		st.Profile = &p.eng.profile.ID // still loaded, draining before a reload stops it
	}
	if !oldest.IsZero() {
		st.OldestWaitMs = now.Sub(oldest).Milliseconds()
	}
	if s.Loaded() == "" || s.gateClosed(now) {
		st.Gate = "closed"
	}
	if p.lastErr != nil {
		msg := p.lastErr.Error()
		st.LastError = &msg
	}
	if b := p.backoff.prof; b != nil {
		st.Failing = p.backoff.status(p.cfg.Lookup(b.ID), now)
	}
	if e := p.eng; e != nil {
		es := &statusapi.Engine{Profile: e.profile.ID, PID: e.h.PID(), Port: e.port, StartedAt: e.startedAt}
		if s.Loaded() == e.profile.ID {
			t := p.readyAt
			es.ReadyAt = &t
		}
		st.Engine = es
	}
	return st
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
