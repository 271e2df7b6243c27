package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// errSleepAbort is the cause given to the requests that a /sleep (mode abort)
// aborts; they finish with finish_reason "abort", as in vLLM.
var errSleepAbort = errors.New("request aborted: the engine was put to sleep")

// sleepState is vLLM's sleep mode as the simulator models it. The engine
// serves only while its weights and KV cache are both awake and, after a
// level-2 sleep, the weights were reloaded; meanwhile requests queue. Server.mu
// guards every field.
type sleepState struct {
	level      int  // the level of the last /sleep, until a wake
	weights    bool // the weights are on the GPU
	kv         bool // the KV cache is on the GPU
	needReload bool // woken from level 2: the weights are garbage until reload_weights
	pausing    bool // a /sleep with mode=wait is letting the requests in flight finish
	// gate is closed while the engine serves; requests that wait for it are
	// queued.
	gate chan struct{}
	// drained, non-nil while a /sleep with mode=wait waits, is closed once
	// no request is in flight.
	drained chan struct{}
	// requests holds the cancel function of each request in flight, so that
	// /sleep can abort them; nextReq numbers them.
	requests map[uint64]context.CancelCauseFunc
	nextReq  uint64
	// With --sim-idle-sleep: idleTimer puts the engine to sleep once it has
	// been idle that long (nil without the flag); idle reports that the
	// engine sleeps because it was idle, and waking that the next request
	// is waking it.
	idleTimer *time.Timer
	idle      bool
	waking    bool
}

func (st *sleepState) init() {
	st.weights, st.kv = true, true
	st.gate = make(chan struct{})
	close(st.gate)
	st.requests = make(map[uint64]context.CancelCauseFunc)
}

func (st *sleepState) serving() bool { return st.weights && st.kv && !st.needReload && !st.pausing }

// asleep is what /is_sleeping says: not everything is awake.
func (st *sleepState) asleep() bool { return !st.weights || !st.kv }

// update opens or closes the gate to match the state.
func (st *sleepState) update() {
	select {
	case <-st.gate:
		if !st.serving() {
			st.gate = make(chan struct{})
		}
	default:
		if st.serving() {
			close(st.gate)
		}
	}
}

// SleepAborted is how many in-flight requests /sleep calls have aborted.
func (s *Server) SleepAborted() int64 { return s.aborted.Load() }

// request is one request admitted to the engine.
type request struct {
	s      *Server
	r      *http.Request // its context ends when /sleep aborts it or the core dies
	cancel context.CancelCauseFunc
	id     uint64
	kv     int // tokens it holds in the KV cache
	start  time.Time
	prompt int // its prompt's tokens
	// generated counts the tokens it made, all choices together; finish is
	// why it ended, a finished_reason of vllm:request_success_total ("abort"
	// until it ends otherwise; "" when the dead core ended it).
	generated int
	finish    string
}

// admit queues r until the engine serves (fully awake) and a slot is free
// under --max-num-seqs, counting it as waiting meanwhile, then counts it as
// running with its prompt (ids) in the KV cache and the prefix cache. ok false
// means r got no place in the engine (the core is dead or dies of it, or r
// ended while queued), and the answer was written.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, info *reqInfo, ids []int) (*request, bool) {
	if s.cfg.DieOnFirstRequest {
		if s.tookFirst.CompareAndSwap(false, true) {
			s.dieAtFirstRequest(w, info)
			return nil, false
		}
		<-s.dead // the first request is killing the core: those beside it die with it
	}
	if s.coreDead() {
		s.failDead(w, info)
		return nil, false
	}
	q := &request{s: s, start: time.Now(), prompt: len(ids), finish: "abort"}
	s.metrics.waiting.Inc()
	ctx := r.Context()
	slot := s.slots == nil // without --max-num-seqs there is no slot to take
	for {
		s.mu.Lock()
		serving, gate := s.sleep.serving(), s.sleep.gate
		if serving && slot {
			break // holding s.mu
		}
		s.mu.Unlock()
		if !serving {
			select {
			case <-gate:
				continue
			case <-ctx.Done():
			case <-s.dead:
			}
		} else {
			select {
			case s.slots <- struct{}{}:
				slot = true
				continue
			case <-ctx.Done():
			case <-s.dead:
			}
		}
		s.metrics.waiting.Dec()
		if slot && s.slots != nil {
			<-s.slots
		}
		if s.coreDead() {
			s.failDead(w, info)
		} else {
			info.status = 499 // the client left while queued
		}
		return nil, false
	}
	// s.mu is held: register the request, as running.
	c, cancel := context.WithCancelCause(ctx)
	q.r, q.cancel = r.WithContext(c), cancel
	q.id = s.sleep.nextReq
	s.sleep.nextReq++
	s.sleep.requests[q.id] = cancel
	s.running++
	q.kv = len(ids)
	s.kvTokens += q.kv
	var hits int
	if s.prefix != nil {
		hits = s.prefix.lookup(ids)
	}
	s.metrics.setLoad(s.running, s.kvTokens, s.kvCap)
	s.mu.Unlock()
	s.metrics.waiting.Dec()
	s.metrics.queueTime.Observe(time.Since(q.start).Seconds())
	s.metrics.promptTokens.Add(float64(len(ids)))
	if s.prefix != nil {
		s.metrics.prefixQueries.Add(float64(len(ids)))
		s.metrics.prefixHits.Add(float64(hits))
	}
	return q, true
}

// awake waits, before the request makes its next token, while the engine
// sleeps with it kept in flight (/sleep?mode=keep), or until done is
// closed; it reports whether the request may go on.
func (q *request) awake(done <-chan struct{}) bool {
	s := q.s
	for {
		s.mu.Lock()
		st := &s.sleep
		paused, gate := st.asleep() || st.needReload, st.gate
		s.mu.Unlock()
		if !paused {
			return true
		}
		select {
		case <-gate:
		case <-done:
			return false
		}
	}
}

// grow adds n generated tokens to the request's share of the KV cache.
func (q *request) grow(n int) {
	s := q.s
	s.mu.Lock()
	q.kv += n
	s.kvTokens += n
	s.metrics.setLoad(s.running, s.kvTokens, s.kvCap)
	s.mu.Unlock()
}

// done ends the request: it leaves the engine with its KV cache and slot.
func (q *request) done() {
	s := q.s
	s.mu.Lock()
	delete(s.sleep.requests, q.id)
	if len(s.sleep.requests) == 0 && s.sleep.drained != nil {
		close(s.sleep.drained)
		s.sleep.drained = nil
	}
	s.running--
	s.kvTokens -= q.kv
	s.metrics.setLoad(s.running, s.kvTokens, s.kvCap)
	s.mu.Unlock()
	if s.slots != nil {
		<-s.slots
	}
	q.cancel(nil)
	s.metrics.finished(q.finish, q.prompt, q.generated, time.Since(q.start))
}

// serveSleep serves vLLM's sleep-mode endpoints and reports whether p is one
// of them. They exist only in dev mode (VLLM_SERVER_DEV_MODE non-zero), as in
// vLLM; without --enable-sleep-mode they fail as vLLM's workers do.
func (s *Server) serveSleep(w http.ResponseWriter, r *http.Request, p string, info *reqInfo) bool {
	switch p {
	case "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache":
	default:
		return false
	}
	if !s.cfg.DevMode {
		return false
	}
	method := http.MethodPost
	if p == "/is_sleeping" {
		method = http.MethodGet
	}
	if !s.allow(w, r, info, method) {
		return true
	}
	if s.coreDead() {
		s.failDead(w, info)
		return true
	}
	if !s.cfg.EnableSleepMode && p != "/reset_prefix_cache" {
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "",
			"Sleep mode is not enabled. Start the engine with --enable-sleep-mode.")
		return true
	}
	switch p {
	case "/sleep":
		s.handleSleep(w, r, info)
	case "/wake_up":
		s.handleWake(w, r, info)
	case "/is_sleeping":
		s.mu.Lock()
		asleep := s.sleep.asleep()
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, []byte(`{"is_sleeping":`+strconv.FormatBool(asleep)+`}`))
	case "/collective_rpc":
		s.handleRPC(w, r, info)
	case "/reset_prefix_cache":
		s.mu.Lock()
		if s.prefix != nil {
			s.prefix.reset()
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}
	return true
}

// handleSleep puts the engine to sleep at ?level= (1, the default, or 2).
// With ?mode=abort (the default) it aborts the requests in flight, which
// finish with finish_reason "abort"; with mode=wait it queues new requests and
// lets those in flight finish first; with mode=keep it keeps them, paused,
// and they go on after the wake (the pause modes of the engine core in
// vllm/v1/engine/core.py). Either way, requests that arrive while it
// sleeps queue until a full wake. Its simulated GPU memory shrinks to the
// residue.
func (s *Server) handleSleep(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	level := 1
	if v := r.URL.Query().Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 2 {
			badRequest(w, info, fmt.Sprintf("level: must be 1 or 2, not %q", v))
			return
		}
		level = n
	}
	mode := r.URL.Query().Get("mode")
	if mode == "" {
		mode = "abort"
	}
	if mode != "abort" && mode != "wait" && mode != "keep" {
		badRequest(w, info, fmt.Sprintf("mode: must be abort, wait or keep, not %q", mode))
		return
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	st := &s.sleep
	n := 0
	if mode == "wait" && len(st.requests) > 0 {
		st.pausing = true
		st.update()
		drained := make(chan struct{})
		st.drained = drained
		s.mu.Unlock()
		s.logger.Info("sleep: waiting for the requests in flight", "mode", mode)
		select {
		case <-drained:
		case <-r.Context().Done():
			s.mu.Lock()
			st.pausing, st.drained = false, nil
			st.update()
			s.mu.Unlock()
			info.status = 499
			return
		}
		s.mu.Lock()
		st.pausing = false
	} else if mode == "abort" {
		n = len(st.requests)
		for _, cancel := range st.requests {
			cancel(errSleepAbort)
		}
	}
	level = s.sleepLocked(level)
	st.idle = false // put to sleep by a caller, it waits for a wake
	s.mu.Unlock()
	s.slept(level)
	if n > 0 {
		s.aborted.Add(int64(n))
		s.metrics.sleepAborted.Add(float64(n))
		s.logger.Warn(fmt.Sprintf("aborted %d in-flight requests on sleep", n), "aborted", n)
	}
	s.logger.Info("sleeping", "level", level, "mode", mode, "aborted", n)
	w.WriteHeader(http.StatusOK)
}

// sleepLocked puts the engine to sleep at level (kept from a sleep already
// under way) and returns the level it sleeps at. The caller holds opMu and
// s.mu, and calls slept after releasing s.mu.
func (s *Server) sleepLocked(level int) int {
	st := &s.sleep
	if !st.asleep() {
		st.level = level
	}
	st.weights, st.kv, st.needReload = false, false, false
	st.update()
	if s.prefix != nil {
		s.prefix.reset() // the KV cache is gone
	}
	return st.level
}

// slept ends a sleep at level: the simulated GPU memory shrinks to its
// residue and vllm:engine_sleep_state reports the level. The caller holds
// opMu.
func (s *Server) slept(level int) {
	if s.mem != nil {
		if err := s.mem.set(false, false); err != nil {
			s.logger.Error("shrinking simulated gpu memory", "err", err)
		}
	}
	s.metrics.setSleepState(level)
}

// handleWake wakes what ?tags= names ("weights", "kv_cache"; repeated), or
// everything without tags, after WakeDelay. Its simulated GPU memory must
// have room, or it fails with 500 as an out-of-memory error and the engine
// stays as it was. Weights woken after a level-2 sleep need reload_weights
// before the engine serves.
func (s *Server) handleWake(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	tags := r.URL.Query()["tags"]
	for _, t := range tags {
		if t != "weights" && t != "kv_cache" {
			badRequest(w, info, fmt.Sprintf("tags: unknown tag %q (use weights or kv_cache)", t))
			return
		}
	}
	weights := len(tags) == 0 || slices.Contains(tags, "weights")
	kv := len(tags) == 0 || slices.Contains(tags, "kv_cache")
	if s.cfg.RefuseWake {
		s.logger.Error("refusing to wake (--sim-refuse-wake)")
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", "simulated wake failure: CUDA out of memory")
		return
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if !sleepCtx(r.Context(), s.cfg.WakeDelay) {
		info.status = 499
		return
	}
	s.mu.Lock()
	st := &s.sleep
	weights, kv = weights || st.weights, kv || st.kv
	s.mu.Unlock()
	if s.mem != nil {
		if err := s.mem.set(weights, kv); err != nil {
			s.logger.Error("wake failed", "err", err)
			writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", err.Error())
			return
		}
	}
	s.mu.Lock()
	level := st.level
	if weights && !st.weights && level == 2 {
		st.needReload = true
	}
	st.weights, st.kv = weights, kv
	if !st.asleep() {
		st.level = 0
	}
	st.idle = false
	st.update()
	if st.idleTimer != nil && !st.asleep() && s.drain.inflight == 0 {
		st.idleTimer.Reset(s.cfg.IdleSleep) // awake and idle again
	}
	s.mu.Unlock()
	s.metrics.setSleepState(0) // vLLM reports "awake" after any wake_up
	s.logger.Info("woke up", "from_level", level, "tags", tags, "weights", weights, "kv_cache", kv)
	w.WriteHeader(http.StatusOK)
}

// handleRPC serves /collective_rpc for the one method poold calls,
// reload_weights, which takes half the load delay (the weights are read
// again, without the compile and graph capture of a cold start). The
// weights must be awake.
func (s *Server) handleRPC(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req struct {
		Method string `json:"method"`
	}
	if !readBody(w, r, info, &req) {
		return
	}
	if req.Method != "reload_weights" {
		badRequest(w, info, fmt.Sprintf("method %q is not simulated (only reload_weights)", req.Method))
		return
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	weights := s.sleep.weights
	s.mu.Unlock()
	if !weights {
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "",
			"reload_weights: the weights are asleep; POST /wake_up?tags=weights first")
		return
	}
	t := time.Now()
	if !sleepCtx(r.Context(), s.cfg.LoadDelay/2) {
		info.status = 499
		return
	}
	s.mu.Lock()
	s.sleep.needReload = false
	s.sleep.update()
	s.mu.Unlock()
	s.logger.LogAttrs(r.Context(), slog.LevelInfo, "weights reloaded", slog.Duration("took", time.Since(t)))
	writeJSON(w, http.StatusOK, []byte(`{"results":[null]}`))
}

// armIdleSleep starts the idle-sleep timer of --sim-idle-sleep; nothing
// without it.
func (s *Server) armIdleSleep() {
	if s.cfg.IdleSleep > 0 {
		s.sleep.idleTimer = time.AfterFunc(s.cfg.IdleSleep, s.idleSleep)
	}
}

// stopIdleSleep ends --sim-idle-sleep for an engine that exits: its timer
// fires no more.
func (s *Server) stopIdleSleep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sleep.idleTimer != nil {
		s.sleep.idleTimer.Stop()
		s.sleep.idleTimer = nil
	}
}

// idleSleep puts an engine idle for --sim-idle-sleep to sleep by itself at
// --sim-idle-sleep-level, as the idle sleep of the newest vLLM servers
// does: no caller asked for it, and only vllm:engine_sleep_state and
// /is_sleeping tell. An engine that is busy, or asleep already, is left as
// it is.
func (s *Server) idleSleep() {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	if s.drain.inflight > 0 || s.sleep.asleep() || s.coreDead() {
		s.mu.Unlock()
		return
	}
	level := s.sleepLocked(s.cfg.IdleSleepLevel)
	s.sleep.idle = true
	s.mu.Unlock()
	s.slept(level)
	s.logger.Info("sleeping after idle time (--sim-idle-sleep)", "level", level, "idle", s.cfg.IdleSleep)
}

// idleWake wakes an engine that slept for being idle, for the request that
// arrived: the wake's time, and after a level-2 sleep the weights'
// reload's, then it serves. A wake that fails (no room on the simulated
// GPUs) leaves it asleep, its requests queued.
func (s *Server) idleWake() {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	st := &s.sleep
	st.waking = false
	if !st.idle {
		s.mu.Unlock()
		return
	}
	level := st.level
	s.mu.Unlock()
	wait := s.cfg.WakeDelay
	if level == 2 {
		wait += s.cfg.LoadDelay / 2
	}
	time.Sleep(wait)
	if s.mem != nil {
		if err := s.mem.set(true, true); err != nil {
			s.logger.Error("waking after idle sleep failed", "err", err)
			return
		}
	}
	s.mu.Lock()
	st.weights, st.kv, st.needReload, st.level, st.idle = true, true, false, 0, false
	st.update()
	s.mu.Unlock()
	s.metrics.setSleepState(0)
	s.logger.Info("woke up for a request after idle sleep", "from_level", level)
}
