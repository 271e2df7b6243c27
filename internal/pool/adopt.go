package pool

import (
	"context"
	"errors"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/statusapi"
)

// Adoption: a poold that starts takes over the engines that its
// predecessor left running under their shims, once each passes
// verification, instead of loading its models again.

// Adopt takes over the engines that a previous poold recorded (as
// Ledger.Recorded returns them), before Run. An engine is adopted when its
// pool still serves its profile, its shim answers with the recorded pid,
// the process is the recorded one, the profile in force would start it with
// the same command and environment (its fingerprint: a change of the
// launcher, the vllm-command setting, counts as one), the engine itself
// listens on its recorded loopback port and no other process does, and it
// answers as recorded: /v1/models lists its profile, or /is_sleeping says
// that it sleeps. An adopted engine serves (or sleeps) in its pool without
// a load; one that fails is stopped under the stop contract and its pool
// loads afresh, as at any start. Each outcome is logged and kept for the
// pool's /status (Adoption). Adopt returns the records that no shim
// answered for (an engine started without one, a shim gone, a pool
// removed): the caller reaps them (Ledger.ReapEngines), through the shims
// that still answer (a pool or a profile removed).
func (s *Set) Adopt(ctx context.Context, recorded []proc.LedgerEngine) (rest []proc.LedgerEngine) {
	for _, rec := range recorded {
		p := s.Pool(rec.Pool)
		if p == nil {
			s.opts.Logger.Warn("an engine left by the previous poold is not adopted: its pool is gone", "pool", rec.Pool, "profile", rec.Profile, "pid", rec.PID)
			rest = append(rest, rec)
			continue
		}
		if !p.adopt(ctx, rec) {
			rest = append(rest, rec)
		}
	}
	return rest
}

// adopt verifies the engine that rec records and takes it into the pool,
// or stops it. It reports whether it dealt with it: false when it could not
// attach to its shim, and the engine's processes are the caller's to reap.
func (p *Pool) adopt(ctx context.Context, rec proc.LedgerEngine) bool {
	e, sh, err := p.attach(rec)
	if err != nil {
		p.noteAdoption(rec, err)
		return false
	}
	if err := p.verify(ctx, e, sh, rec); err != nil {
		p.noteAdoption(rec, err)
		// An engine whose process is not the recorded one is stopped by
		// its shim, which alone knows its child: its pid and group may
		// be another's now.
		grace := e.profile.StopTimeout.Duration
		var stopErr error
		if errors.Is(err, proc.ErrNotRecorded) {
			stopErr = sh.StopThroughShim(grace, e.hurry, p.log.With("profile", rec.Profile, "pid", rec.PID))
		} else {
			stopErr = e.stop(grace, p.log)
		}
		if stopErr != nil {
			p.log.Error("stopping the engine not adopted", "profile", rec.Profile, "pid", rec.PID, "err", stopErr)
		}
		proc.RemoveShimFiles(rec.Shim)
		return true
	}
	p.take(e, rec.Sleeping)
	p.noteAdoption(rec, nil)
	return true
}

// attach attaches to the shim of the engine that rec records and returns
// the engine, followed as one that poold started, and its handle, or why
// it cannot.
func (p *Pool) attach(rec proc.LedgerEngine) (*engine, *proc.Shimmed, error) {
	p.mu.Lock()
	prof, spec := p.cfg.Lookup(rec.Profile), p.spec
	served := prof != nil && p.servesLocked(prof.ID)
	p.mu.Unlock()
	switch {
	case rec.Shim == "":
		return nil, nil, errors.New("it was started without a supervisor (keep-engines-on-restart was off)")
	case !served:
		return nil, nil, errors.New("its profile is no longer served by the pool")
	}
	sh, err := p.supervisor().Adopt(rec, p.log.With("profile", prof.ID))
	if err != nil {
		return nil, nil, err
	}
	e := newEngine(prof, spec, p.opts.Launch, rec.Port, p.http, p.opts.hurry)
	e.h = sh
	e.run(p.outputLog().with("profile", prof.ID, "pid", rec.PID))
	return e, sh, nil
}

// verify checks that e, attached through its shim as sh, is the engine
// that rec records, as the profile in force would run it, that it answers
// as recorded (Shimmed.Verify), and that the pool has room for it.
func (p *Pool) verify(ctx context.Context, e *engine, sh *proc.Shimmed, rec proc.LedgerEngine) error {
	p.mu.Lock()
	allowExposed := p.spec.AllowNonLoopback
	p.mu.Unlock()
	want := proc.Want{ID: e.profile.ID, Argv: e.argv, Env: e.env, Given: e.given, MaySleep: e.profile.SleepLevel() > 0, AllowExposed: allowExposed}
	if err := sh.Verify(ctx, rec, e.api, want, p.log.With("profile", rec.Profile, "pid", rec.PID)); err != nil {
		return err
	}
	p.mu.Lock()
	busy := rec.Sleeping == 0 && p.eng != nil
	p.mu.Unlock()
	if busy {
		return errors.New("the pool already has an awake engine")
	}
	return nil
}

// take makes e, verified, the pool's engine, ready, or (asleep at level) one
// of its sleepers.
func (p *Pool) take(e *engine, level int) {
	e.served.Store(true)
	p.opts.Ledger.Add(e.record(p.name))
	p.opts.Ledger.Asleep(e.h.PID(), level)
	now := p.opts.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if level > 0 {
		var need int64
		if level == 1 {
			need = weightBytes(e.profile)
		}
		p.opts.host.reserve(need, 0) // the engine holds it, within budget or not
		sl := &sleeper{eng: e, level: level, since: now, hostBytes: need, gone: make(chan struct{})}
		p.sleepers = append(p.sleepers, sl)
		p.watchSleeper(sl)
		p.noteActivityLocked()
		return
	}
	p.sched.Begin(e.profile.ID)
	p.eng = e
	e.startedAt = now
	p.watchHealth(e)
	p.readyAt = now
	p.setStateLocked(StateReady)
	p.answerLocked(p.sched.Ready(e.profile.ID, now), nil)
	p.noteActivityLocked()
}

// noteAdoption logs what became of the engine that rec records, and keeps
// it for /status; err is why it was not adopted, nil when it was.
func (p *Pool) noteAdoption(rec proc.LedgerEngine, err error) {
	a := statusapi.Adoption{Profile: rec.Profile, PID: rec.PID, Adopted: err == nil, Sleeping: rec.Sleeping}
	if err != nil {
		a.Reason = err.Error()
		p.log.Warn("an engine left running by the previous poold is not adopted; it is stopped, and the pool loads afresh", "profile", rec.Profile, "pid", rec.PID, "port", rec.Port, "err", err)
	} else {
		p.log.Info("adopted an engine left running by the previous poold", "profile", rec.Profile, "pid", rec.PID, "port", rec.Port, "sleeping", rec.Sleeping)
	}
	p.mu.Lock()
	p.adoption = append(p.adoption, a)
	p.mu.Unlock()
}

// record is e as the ledger records it, running on pool.
func (e *engine) record(pool string) proc.LedgerEngine {
	rec := e.h.Record()
	rec.Pool, rec.Profile, rec.Argv, rec.EnvSums = pool, e.profile.ID, e.argv, proc.EnvSums(e.given)
	return rec
}
