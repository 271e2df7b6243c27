package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/shim"
	"github.com/poold/poold/internal/statusapi"
)

// Adoption: a poold that starts takes over the engines that its
// predecessor left running under their shims, once each passes
// verification, instead of loading its models again.

// adoptTimeout bounds each of the calls to an engine in its verification,
// as proc.AttachTimeout bounds the attach to its shim.
const adoptTimeout = proc.AttachTimeout

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
// that rec records, as the profile in force would run it, and that it
// answers as recorded.
func (p *Pool) verify(ctx context.Context, e *engine, sh *proc.Shimmed, rec proc.LedgerEngine) error {
	if err := sh.Recorded(); err != nil {
		return err
	}
	// A shim started by an older poold holds a fingerprint of the whole
	// environment: it stands while poold's own environment has not changed.
	if fp := sh.Fingerprint(); fp != shim.Fingerprint(e.argv, e.given) && fp != shim.Fingerprint(e.argv, e.env) {
		return fmt.Errorf("its profile changed while poold was down, or the vllm-command setting did: %s", changes(rec, e.argv, e.given))
	}
	p.mu.Lock()
	busy, allowExposed := rec.Sleeping == 0 && p.eng != nil, p.spec.AllowNonLoopback
	p.mu.Unlock()
	if busy {
		return errors.New("the pool already has an awake engine")
	}
	if _, err := p.checkSockets(e, allowExposed); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, adoptTimeout)
	defer cancel()
	if rec.Sleeping > 0 || e.profile.SleepLevel() > 0 {
		asleep, err := e.isSleeping(ctx)
		switch {
		case err != nil:
			return err
		case asleep != (rec.Sleeping > 0):
			return fmt.Errorf("it was recorded asleep at level %d, and GET /is_sleeping says %v", rec.Sleeping, asleep)
		}
	}
	if rec.Sleeping == 0 {
		if ok, seen := e.serves(ctx); !ok {
			return fmt.Errorf("GET /v1/models: %s", seen)
		}
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
	rec.Pool, rec.Profile, rec.Argv, rec.EnvSums = pool, e.profile.ID, e.argv, envSums(e.given)
	return rec
}

// envSums is a digest of each variable of env by name: the first 16 hex
// digits of the sha256 of its value, enough to tell a change, without
// keeping a value that may be a secret.
func envSums(env []string) map[string]string {
	sums := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		sum := sha256.Sum256([]byte(v))
		sums[k] = hex.EncodeToString(sum[:8])
	}
	return sums
}

// changes says what differs between the engine rec records and the one the
// profile in force would start with argv and given: the flags of the
// command line added, removed or changed, and the variables, by name only
// (a value may be a secret). A ledger of an older poold records neither.
func changes(rec proc.LedgerEngine, argv, given []string) string {
	if rec.Argv == nil {
		return "another command line or environment"
	}
	var parts []string
	added, removed, changed := argChanges(rec.Argv, argv)
	for _, c := range []struct {
		what  string
		names []string
	}{{"added", added}, {"removed", removed}, {"changed", changed}} {
		if len(c.names) > 0 {
			parts = append(parts, fmt.Sprintf("argument %s %s", strings.Join(c.names, ", "), c.what))
		}
	}
	now := envSums(given)
	var vars [3][]string // added, removed, changed
	for _, k := range slices.Sorted(maps.Keys(now)) {
		switch old, ok := rec.EnvSums[k]; {
		case !ok:
			vars[0] = append(vars[0], k)
		case old != now[k]:
			vars[2] = append(vars[2], k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(rec.EnvSums)) {
		if _, ok := now[k]; !ok {
			vars[1] = append(vars[1], k)
		}
	}
	for i, what := range []string{"added", "removed", "changed"} {
		if len(vars[i]) > 0 {
			parts = append(parts, fmt.Sprintf("variable %s %s", strings.Join(vars[i], ", "), what))
		}
	}
	if len(parts) == 0 {
		return "another command line or environment"
	}
	return strings.Join(parts, "; ")
}

// argChanges names the arguments that differ between the command lines was
// and now, past what they share at both ends: each by its flag (cut at
// "="), a flag's value by the flag before it, or by its place ("#3"); the
// values themselves are not shown.
func argChanges(was, now []string) (added, removed, changed []string) {
	pre := 0
	for pre < len(was) && pre < len(now) && was[pre] == now[pre] {
		pre++
	}
	suf := 0
	for suf < len(was)-pre && suf < len(now)-pre && was[len(was)-1-suf] == now[len(now)-1-suf] {
		suf++
	}
	name := func(argv []string, i int) string {
		switch a := argv[i]; {
		case strings.HasPrefix(a, "-"):
			flag, _, _ := strings.Cut(a, "=")
			return flag
		case i > 0 && strings.HasPrefix(argv[i-1], "-"):
			flag, _, _ := strings.Cut(argv[i-1], "=")
			return flag
		}
		return "#" + strconv.Itoa(i)
	}
	var old, cur []string
	for i := pre; i < len(was)-suf; i++ {
		old = append(old, name(was, i))
	}
	for i := pre; i < len(now)-suf; i++ {
		cur = append(cur, name(now, i))
	}
	for _, n := range uniq(cur) {
		if slices.Contains(old, n) {
			changed = append(changed, n)
		} else {
			added = append(added, n)
		}
	}
	for _, n := range uniq(old) {
		if !slices.Contains(cur, n) {
			removed = append(removed, n)
		}
	}
	return added, removed, changed
}

// uniq is names without repeats, in their first order.
func uniq(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
