package enginesim

import (
	"errors"
	"net/http"
	"time"
)

// errShutdownAbort is the cause given to the requests still in flight when
// --shutdown-timeout runs out; they finish with finish_reason "abort".
var errShutdownAbort = errors.New("request aborted: the server is shutting down")

// unavailable is the answer to every request but /metrics while the server
// drains, as vLLM's ScalingMiddleware (vllm/entrypoints/serve/middleware.py)
// gives it.
var unavailable = []byte(`{"error":"Server is unavailable. Please try again later."}`)

// abortGrace bounds the wait for the answers of the requests that the end
// of --shutdown-timeout aborted.
const abortGrace = 2 * time.Second

// drainState is the server's shutdown with --shutdown-timeout. Server.mu
// guards every field.
type drainState struct {
	rejecting bool // the server answers new requests 503
	inflight  int  // inference requests being served (queued or generating)
	// idle, non-nil while drain waits, is closed once inflight is zero.
	idle chan struct{}
}

// isAbort reports whether cause aborted a request on the engine's side
// (a /sleep, or the end of the shutdown timeout): it ends with what it made
// and finish_reason "abort".
func isAbort(cause error) bool {
	return errors.Is(cause, errSleepAbort) || errors.Is(cause, errShutdownAbort)
}

// rejecting reports whether the server drains and refuses new requests.
func (s *Server) rejecting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drain.rejecting
}

// enter counts an inference request in flight, unless the server drains.
// The engine is busy from then on: its idle-sleep timer stops, and an
// engine that slept for being idle wakes.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drain.rejecting {
		return false
	}
	s.drain.inflight++
	if st := &s.sleep; st.idleTimer != nil {
		st.idleTimer.Stop()
		if st.idle && !st.waking {
			st.waking = true
			go s.idleWake()
		}
	}
	return true
}

// leave ends what enter began; the last request to leave starts the
// engine's idle time.
func (s *Server) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drain.inflight--
	if s.drain.inflight > 0 {
		return
	}
	if s.drain.idle != nil {
		close(s.drain.idle)
		s.drain.idle = nil
	}
	if s.sleep.idleTimer != nil {
		s.sleep.idleTimer.Reset(s.cfg.IdleSleep)
	}
}

// writeUnavailable answers a request that came while the server drains.
func writeUnavailable(w http.ResponseWriter, info *reqInfo) {
	info.status = http.StatusServiceUnavailable
	writeJSON(w, http.StatusServiceUnavailable, unavailable)
}

// shutdown drains the server as vLLM does on SIGTERM with
// --shutdown-timeout N (vllm/entrypoints/launcher.py and the engine core's
// shutdown in vllm/v1/engine/core.py): from now on every request but
// /metrics is answered 503, the requests in flight run on for up to
// timeout, and those still generating then are aborted (finish_reason
// "abort") and given abortGrace to answer. It returns once none is in
// flight or that grace ran out; Run then closes the server.
func (s *Server) shutdown(timeout time.Duration) {
	s.mu.Lock()
	s.drain.rejecting = true
	n := s.drain.inflight
	idle := make(chan struct{})
	if n == 0 {
		close(idle)
	} else {
		s.drain.idle = idle
	}
	s.mu.Unlock()
	s.logger.Info("shutting down: draining the requests in flight", "in_flight", n, "shutdown_timeout", timeout)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
		s.logger.Info("shutdown: every request in flight finished")
		return
	case <-t.C:
	}
	s.mu.Lock()
	aborted := len(s.sleep.requests)
	for _, cancel := range s.sleep.requests {
		cancel(errShutdownAbort)
	}
	s.mu.Unlock()
	s.logger.Warn("shutdown timeout reached: aborting the requests in flight", "aborted", aborted)
	t.Reset(abortGrace)
	select {
	case <-idle:
	case <-t.C:
	}
}
