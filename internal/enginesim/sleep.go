package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// errSleepAbort is the cause given to the requests that a /sleep aborts.
var errSleepAbort = errors.New("request aborted: the engine was put to sleep")

// sleepState is vLLM's sleep mode as the simulator models it. Server.mu guards
// every field.
type sleepState struct {
	level      int  // 1 or 2 while asleep, 0 awake
	needReload bool // woken from level 2: the weights are garbage until reload_weights
	// requests holds the cancel function of each request generating now, so
	// that /sleep can abort them as vLLM does; nextReq numbers them.
	requests map[uint64]context.CancelCauseFunc
	nextReq  uint64
}

// SleepAborted is how many in-flight requests /sleep calls have aborted.
func (s *Server) SleepAborted() int64 { return s.aborted.Load() }

// enter registers a request that is about to generate, so that /sleep can
// abort it, and returns it with the context the abort cancels and the
// function that ends the registration. While the engine sleeps (or after a
// level-2 wake, before reload_weights) it answers the error vLLM's dead
// weights give and returns ok false.
func (s *Server) enter(w http.ResponseWriter, r *http.Request, info *reqInfo) (_ *http.Request, leave func(), ok bool) {
	s.mu.Lock()
	st := &s.sleep
	if st.level > 0 || st.needReload {
		asleep := st.level > 0
		s.mu.Unlock()
		msg := "the engine is sleeping; POST /wake_up first"
		if !asleep {
			msg = "the weights were discarded by a level-2 sleep; POST /collective_rpc reload_weights first"
		}
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", msg)
		return nil, nil, false
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	id := st.nextReq
	st.nextReq++
	if st.requests == nil {
		st.requests = make(map[uint64]context.CancelCauseFunc)
	}
	st.requests[id] = cancel
	s.mu.Unlock()
	return r.WithContext(ctx), func() {
		s.mu.Lock()
		delete(st.requests, id)
		s.mu.Unlock()
		cancel(nil)
	}, true
}

// abortedBySleep reports whether r ended because /sleep aborted it.
func abortedBySleep(r *http.Request) bool {
	return errors.Is(context.Cause(r.Context()), errSleepAbort)
}

// serveSleep serves vLLM's sleep-mode endpoints and reports whether path is
// one of them. They exist only in dev mode (VLLM_SERVER_DEV_MODE=1), as in
// vLLM; without --enable-sleep-mode they fail as vLLM's workers do.
func (s *Server) serveSleep(w http.ResponseWriter, r *http.Request, info *reqInfo) bool {
	switch r.URL.Path {
	case "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache":
	default:
		return false
	}
	if !s.cfg.DevMode {
		return false
	}
	method := http.MethodPost
	if r.URL.Path == "/is_sleeping" {
		method = http.MethodGet
	}
	if !s.allow(w, r, info, method) {
		return true
	}
	if !s.cfg.EnableSleepMode && r.URL.Path != "/reset_prefix_cache" {
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "",
			"Sleep mode is not enabled. Start the engine with --enable-sleep-mode.")
		return true
	}
	switch r.URL.Path {
	case "/sleep":
		s.handleSleep(w, r, info)
	case "/wake_up":
		s.handleWake(w, r, info)
	case "/is_sleeping":
		s.mu.Lock()
		asleep := s.sleep.level > 0
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, []byte(`{"is_sleeping":`+strconv.FormatBool(asleep)+`}`))
	case "/collective_rpc":
		s.handleRPC(w, r, info)
	case "/reset_prefix_cache":
		w.WriteHeader(http.StatusOK)
	}
	return true
}

// handleSleep puts the engine to sleep at ?level= (default 1), aborting the
// requests in flight as vLLM's default sleep does.
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
	s.mu.Lock()
	n := len(s.sleep.requests)
	for _, cancel := range s.sleep.requests {
		cancel(errSleepAbort)
	}
	clear(s.sleep.requests)
	if s.sleep.level == 0 {
		s.sleep.level = level
		s.sleep.needReload = false
	}
	s.mu.Unlock()
	if n > 0 {
		s.aborted.Add(int64(n))
		s.metrics.sleepAborted.Add(float64(n))
		s.logger.Warn(fmt.Sprintf("aborted %d in-flight requests on sleep", n), "aborted", n)
	}
	s.logger.Info("sleeping", "level", level, "aborted", n)
	w.WriteHeader(http.StatusOK)
}

// handleWake wakes the engine after WakeDelay; a level-2 sleeper then needs
// reload_weights before it generates sense again.
func (s *Server) handleWake(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	if s.cfg.RefuseWake {
		s.logger.Error("refusing to wake (--sim-refuse-wake)")
		writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", "simulated wake failure: CUDA out of memory")
		return
	}
	if !sleepCtx(r.Context(), s.cfg.WakeDelay) {
		info.status = 499
		return
	}
	s.mu.Lock()
	level := s.sleep.level
	if level == 2 {
		s.sleep.needReload = true
	}
	s.sleep.level = 0
	s.mu.Unlock()
	s.logger.Info("woke up", "from_level", level)
	w.WriteHeader(http.StatusOK)
}

// handleRPC serves /collective_rpc for the one method poold calls,
// reload_weights, which takes half the load delay (the weights are read
// again, without the compile and graph capture of a cold start).
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
	t := time.Now()
	if !sleepCtx(r.Context(), s.cfg.LoadDelay/2) {
		info.status = 499
		return
	}
	s.mu.Lock()
	s.sleep.needReload = false
	s.mu.Unlock()
	s.logger.LogAttrs(r.Context(), slog.LevelInfo, "weights reloaded", slog.Duration("took", time.Since(t)))
	writeJSON(w, http.StatusOK, []byte(`{"results":[null]}`))
}
