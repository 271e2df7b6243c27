package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// Swap kinds (Observer.Swap).
const (
	KindCold = "cold" // a new engine process was started
	KindWake = "wake" // a sleeping engine was woken
)

// sleeper is an engine put to sleep: its process and port stay, its weights
// are in host RAM (level 1) or dropped (level 2), and it waits to be woken or
// evicted. Its fields do not change once it is in the pool's list.
type sleeper struct {
	eng       *engine
	level     int
	since     time.Time     // when it fell asleep: the least recently used goes first
	hostBytes int64         // host RAM it holds, counted against the host's budget
	gone      chan struct{} // closed when it leaves the list (woken or stopped)
}

// hostSleep counts the host RAM that the sleepers of every pool of a Set hold.
type hostSleep struct{ held atomic.Int64 }

// reserve counts n more bytes held if that stays within limit (zero: none).
func (h *hostSleep) reserve(n, limit int64) bool {
	for {
		cur := h.held.Load()
		if limit > 0 && cur+n > limit {
			return false
		}
		if h.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (h *hostSleep) release(n int64) { h.held.Add(-n) }

// warmupTimeout bounds the warm-up probe after a wake.
const warmupTimeout = 30 * time.Second

// controlClient sends the sleep-mode calls; each is bounded by its context.
var controlClient = &http.Client{}

// call sends one sleep-mode request to the engine and returns the status and
// (the start of) the body. It fails on a transport error (status 0) or a
// status other than 2xx, naming the path and the engine's answer.
func (e *engine) call(ctx context.Context, method, path, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.base()+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := controlClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp.StatusCode, b, nil
}

// isSleeping asks the engine whether it sleeps (GET /is_sleeping).
func (e *engine) isSleeping(ctx context.Context) (bool, error) {
	_, b, err := e.call(ctx, http.MethodGet, "/is_sleeping", "")
	if err != nil {
		return false, err
	}
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.IsSleeping == nil {
		return false, fmt.Errorf("GET /is_sleeping: unexpected answer %q", b)
	}
	return *v.IsSleeping, nil
}

// sleep puts the engine to sleep at level and confirms it with /is_sleeping.
// The pool has drained it: vLLM's sleep aborts the requests in flight.
func (e *engine) sleep(ctx context.Context, level int) error {
	if _, _, err := e.call(ctx, http.MethodPost, "/sleep?level="+strconv.Itoa(level), ""); err != nil {
		return err
	}
	asleep, err := e.isSleeping(ctx)
	if err == nil && !asleep {
		err = errors.New("GET /is_sleeping: still awake after /sleep")
	}
	return err
}

// wakeUp wakes a sleeping engine: /wake_up (after level 2 also reload_weights
// and a prefix-cache reset), the readiness gate, and a 1-token warm-up probe
// that proves it generates. timeout bounds it all.
func (e *engine) wakeUp(ctx context.Context, level int, timeout time.Duration) error {
	select {
	case <-e.exited:
		return fmt.Errorf("died while asleep: %w", e.failure())
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, _, err := e.call(ctx, http.MethodPost, "/wake_up", ""); err != nil {
		return err
	}
	if level == 2 {
		if _, _, err := e.call(ctx, http.MethodPost, "/collective_rpc", `{"method":"reload_weights"}`); err != nil {
			return err
		}
		if _, _, err := e.call(ctx, http.MethodPost, "/reset_prefix_cache", ""); err != nil {
			return err
		}
	}
	if err := e.waitReady(ctx, timeout); err != nil {
		return err
	}
	return e.warmUp(ctx)
}

// warmUp sends a 1-token completion. Any answer but a 5xx passes: a 4xx
// (an embedding model refusing completions, say) still comes from a live
// model, while a sleeping engine fails with 500.
func (e *engine) warmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	defer cancel()
	id, _ := json.Marshal(e.profile.ID)
	body := `{"model":` + string(id) + `,"prompt":"warm-up","max_tokens":1}`
	if status, _, err := e.call(ctx, http.MethodPost, "/v1/completions", body); err != nil && (status == 0 || status >= 500) {
		return fmt.Errorf("warm-up probe: %w", err)
	}
	return nil
}

// weightBytes is the host RAM a level-1 sleeper of prof holds: its
// weightBytes, else the size of its model directory where readable, else 0
// (unknown).
func weightBytes(prof *profile.Profile) int64 {
	if prof.WeightBytes > 0 {
		return prof.WeightBytes
	}
	return dirSize(prof.Model, 100_000)
}

// dirSize sums the sizes of the regular files under dir (following symlinks,
// as a Hugging Face snapshot links into its blobs), visiting at most max
// entries; 0 when dir is not a readable directory.
func dirSize(dir string, max int) int64 {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return 0
	}
	var total int64
	seen := 0
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if seen++; seen > max {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() {
			return nil
		}
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			total += st.Size()
		}
		return nil
	})
	return total
}

// sleepOut tries to put old, the engine the pool swaps out, to sleep instead
// of stopping it, and reports whether it did. It does when its profile (as
// the pool serves it now, unchanged) enables sleep, room is made among the
// pool's sleepers (maxSleeping, and the host's sleepMemoryBudget, evicting
// the least recently used with a full stop), the engine confirms it sleeps
// and, with a VRAM check configured, the pool's GPU memory dropped. No lease
// is open: the pool drained it.
func (p *Pool) sleepOut(ctx context.Context, old *engine, retired bool) bool {
	p.mu.Lock()
	prof := p.cfg.Lookup(old.profile.ID)
	level, maxSleeping, budget, gpus := 0, p.spec.MaxSleeping, p.cfg.Defaults.SleepMemoryBudget, p.spec.GPUs
	if !retired && p.servesLocked(old.profile.ID) && old.runs(prof, p.spec, p.opts.Self) {
		level = prof.SleepLevel()
	}
	p.mu.Unlock()
	select {
	case <-old.exited:
		return false
	default:
	}
	if level == 0 || maxSleeping <= 0 {
		return false
	}
	var need int64
	if level == 1 {
		need = weightBytes(old.profile)
	}
	for p.sleeperCount() >= maxSleeping && p.evictOldest("maxSleeping") {
	}
	for !p.opts.host.reserve(need, budget) {
		if !p.evictOldest("sleepMemoryBudget") {
			p.log.Info("no room in sleepMemoryBudget; stopping instead", "profile", old.profile.ID, "weight_bytes", need, "budget", budget)
			return false
		}
	}
	p.mu.Lock()
	p.setStateLocked(StateSleeping)
	p.mu.Unlock()
	var released func() error
	if p.opts.VRAM != nil {
		released = p.opts.VRAM.WatchSleep(gpus, groupMembers(old.pid))
	}
	sctx, cancel := context.WithTimeout(ctx, old.profile.StopTimeout.Duration)
	err := old.sleep(sctx, level)
	cancel()
	if err != nil {
		p.opts.host.release(need)
		p.log.Warn("putting engine to sleep failed; stopping it", "profile", old.profile.ID, "err", err)
		return false
	}
	if released != nil {
		if err := released(); err != nil { // a sleeper that frees nothing is worth nothing
			p.opts.host.release(need)
			p.log.Warn("sleeping engine's GPU memory not released; stopping it", "profile", old.profile.ID, "gpus", gpus, "err", err)
			if p.opts.Observer != nil {
				p.opts.Observer.SleepVRAMNotReleased(p.name)
			}
			return false
		}
	}
	sl := &sleeper{eng: old, level: level, since: p.opts.Now(), hostBytes: need, gone: make(chan struct{})}
	p.mu.Lock()
	p.sleepers = append(p.sleepers, sl)
	if p.eng == old {
		p.eng = nil
	}
	p.mu.Unlock()
	go func() { // a sleeper that exits on its own is noticed by the run loop
		select {
		case <-old.exited:
			p.wake()
		case <-sl.gone:
		}
	}()
	p.log.Info("engine asleep", "profile", old.profile.ID, "level", level, "host_bytes", need)
	return true
}

func (p *Pool) sleeperCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sleepers)
}

// takeSleeperLocked removes and returns the sleeper of profile id, or nil.
// p.mu must be held.
func (p *Pool) takeSleeperLocked(id string) *sleeper {
	for i, sl := range p.sleepers {
		if sl.eng.profile.ID == id {
			p.sleepers = append(p.sleepers[:i:i], p.sleepers[i+1:]...)
			p.dropSleeper(sl)
			return sl
		}
	}
	return nil
}

// dropSleeper accounts for sl leaving the list.
func (p *Pool) dropSleeper(sl *sleeper) {
	close(sl.gone)
	p.opts.host.release(sl.hostBytes)
}

// hasSleeperLocked reports whether profile id sleeps in the pool. p.mu must be held.
func (p *Pool) hasSleeperLocked(id string) bool {
	for _, sl := range p.sleepers {
		if sl.eng.profile.ID == id {
			return true
		}
	}
	return false
}

// evictOldest stops the least recently used sleeper, if any, and reports
// whether there was one.
func (p *Pool) evictOldest(why string) bool {
	p.mu.Lock()
	if len(p.sleepers) == 0 {
		p.mu.Unlock()
		return false
	}
	sl := p.sleepers[0]
	p.sleepers = p.sleepers[1:]
	p.dropSleeper(sl)
	p.mu.Unlock()
	p.stopSleeper(sl, "evicted ("+why+")")
	return true
}

// staleSleeperLocked takes out of the list and returns the first sleeper that
// must go: one that exited, whose profile a reload removed or changed, or
// beyond the pool's maxSleeping (lowered by a reload). p.mu must be held.
func (p *Pool) staleSleeperLocked() (*sleeper, string) {
	for i, sl := range p.sleepers {
		why := ""
		select {
		case <-sl.eng.exited:
			why = "exited while asleep"
		default:
			id := sl.eng.profile.ID
			switch {
			case !p.servesLocked(id):
				why = "profile removed"
			case !sl.eng.runs(p.cfg.Lookup(id), p.spec, p.opts.Self) || p.cfg.Lookup(id).SleepLevel() == 0:
				why = "profile changed"
			case len(p.sleepers)-i > p.spec.MaxSleeping:
				why = "maxSleeping"
			default:
				continue
			}
		}
		p.sleepers = append(p.sleepers[:i:i], p.sleepers[i+1:]...)
		p.dropSleeper(sl)
		return sl, why
	}
	return nil, ""
}

// stopSleeper stops a sleeper that left the list under the stop contract
// (group checked empty); one that exited has its group reaped.
func (p *Pool) stopSleeper(sl *sleeper, why string) {
	e := sl.eng
	reason, grace := "stopped", e.profile.StopTimeout.Duration
	select {
	case <-e.exited:
		reason, grace = "crashed", 0
		p.log.Error("sleeping engine exited", "profile", e.profile.ID, "err", e.failure())
	default:
		p.log.Info("stopping sleeping engine", "profile", e.profile.ID, "pid", e.pid, "why", why)
	}
	if _, err := p.stopGroup(e, grace); err != nil {
		p.log.Error("stopping sleeping engine", "profile", e.profile.ID, "err", err)
		return
	}
	p.observeExit(e.profile.ID, reason)
}

// makeGPURoom runs before the pool wakes or starts an engine for prof. With a
// VRAM check configured, it evicts the pool's sleepers, least recently used
// first, while the pool's GPUs have less free memory than prof needs: its
// weight size (weightBytes, declared or estimated), else, unknown, a tenth
// of the GPUs' total memory. With none left to evict, or the GPUs unreadable,
// the engine starts anyway: vLLM itself fails a start that does not fit.
func (p *Pool) makeGPURoom(prof *profile.Profile, gpus []int) {
	if p.opts.VRAM == nil {
		return
	}
	weights := uint64(weightBytes(prof))
	for {
		free, total, err := p.opts.VRAM.Free(gpus)
		if err != nil {
			p.log.Warn("reading free GPU memory; evicting no sleeper", "profile", prof.ID, "gpus", gpus, "err", err)
			return
		}
		need := weights
		if need == 0 {
			need = total / 10
		}
		if free >= need {
			return
		}
		if !p.evictOldest(fmt.Sprintf("gpu memory: %d bytes free, %d needed", free, need)) {
			p.log.Warn("too little free GPU memory and no sleeper to evict; starting anyway", "profile", prof.ID, "gpus", gpus, "free_bytes", free, "need_bytes", need)
			return
		}
	}
}

// stopSleepers stops every sleeper, for shutdown.
func (p *Pool) stopSleepers() {
	for p.evictOldest("shutdown") {
	}
}

// sleepStatusLocked lists the sleepers for /status. p.mu must be held.
func (p *Pool) sleepStatusLocked() []statusapi.Sleeper {
	list := make([]statusapi.Sleeper, len(p.sleepers))
	for i, sl := range p.sleepers {
		list[i] = statusapi.Sleeper{Profile: sl.eng.profile.ID, Level: sl.level, Since: sl.since, HostBytes: sl.hostBytes, PID: sl.eng.pid, Port: sl.eng.port}
	}
	return list
}

// wakeSleeper wakes sl, the sleeper of the profile the pool swaps to, as the
// pool's engine, and reports whether it serves now. A wake that fails (or a
// sleeper that died) is stopped, reported as a swap result "wake_failed",
// and the caller starts the profile cold.
func (p *Pool) wakeSleeper(ctx context.Context, sl *sleeper, from string, phases map[string]time.Duration) bool {
	e, t := sl.eng, p.opts.Now()
	p.log.Info("waking engine", "profile", e.profile.ID, "level", sl.level, "asleep_for", t.Sub(sl.since))
	err := e.wakeUp(ctx, sl.level, e.profile.StartupTimeout.Duration)
	if err == nil {
		phases["wake"] = p.opts.Now().Sub(t)
		return true
	}
	p.log.Warn("wake failed; starting cold instead", "profile", e.profile.ID, "err", err)
	if _, stopErr := p.stopGroup(e, e.profile.StopTimeout.Duration); stopErr != nil {
		p.log.Error("stopping engine that failed to wake", "profile", e.profile.ID, "err", stopErr)
	}
	p.mu.Lock()
	if p.eng == e {
		p.eng = nil
	}
	p.mu.Unlock()
	p.observeExit(e.profile.ID, "load_failed")
	p.observeSwap(from, e.profile.ID, KindWake, "wake_failed", phases)
	return false
}
