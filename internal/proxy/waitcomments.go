package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
)

// maxErrorBody bounds the error body kept to turn into a final SSE event,
// and the engine's error answer read to reshape it (reshapeError).
const maxErrorBody = 16 << 10

// keepAlive is the ResponseWriter of a streaming request that may wait for its
// lease. Until the wait outlasts one interval it is transparent. Then it
// commits the response (200, text/event-stream) and writes an SSE comment
// (": loading <model>, 12s") every interval, which clients ignore and which
// keep the idle timeouts of proxies in between from firing.
//
// Once committed, a status code can no longer carry an error, so a later
// non-2xx answer (queue timeout, failed load, an engine's own error) is kept,
// up to maxErrorBody, and sent by finish as the stream's last event,
// `data: {"error": {…}}`, which OpenAI's SDKs raise as a streaming error
// (on the Messages route Anthropic's `event: error`, which Anthropic's
// SDKs raise: see openai.ErrorEvent).
// Its Retry-After, which no header can carry any more, goes into the message.
//
// It is used by one goroutine at a time: the keep-alive timer's while the
// request waits for its lease, then the request's.
type keepAlive struct {
	http.ResponseWriter
	anthropic bool // the Messages route's: the last event is Anthropic's
	committed bool
	status    int          // the status written after the commit; 0 when none
	header    http.Header  // headers set after the commit, which the client never sees
	body      bytes.Buffer // the body of a non-2xx answer after the commit
}

// acquireKeepAlive acquires a lease for prof like Set.Acquire (with hold), writing a
// keep-alive comment to k every interval while the request waits. started is
// when the request arrived. The comments come from a timer, so a request
// admitted at once costs no goroutine: Acquire runs on the request's own.
func (h *Handler) acquireKeepAlive(k *keepAlive, r *http.Request, prof *profile.Profile, c pool.Caller, started time.Time, hold func() bool) (*pool.Lease, error) {
	var (
		mu      sync.Mutex // orders the timer's writes to k before the request's
		stopped bool       // guarded by mu: the request has its answer; no more comments
		tick    *time.Timer
	)
	mu.Lock()
	tick = time.AfterFunc(h.opts.KeepAliveInterval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		k.comment(fmt.Sprintf("loading %s, %ds", prof.ID, int(time.Since(started).Seconds())))
		tick.Reset(h.opts.KeepAliveInterval)
	})
	mu.Unlock()
	// Acquire is bounded by maxQueueWait and the client's context, so this ends.
	lease, err := h.pools.Acquire(r.Context(), prof, r.PathValue("pool"), c, hold)
	mu.Lock()
	stopped = true
	tick.Stop()
	mu.Unlock()
	return lease, err
}

// comment commits the response if needed and writes one SSE comment line.
// A write error (the client left) is ignored: the request's context ends too.
func (k *keepAlive) comment(text string) {
	if !k.committed {
		h := k.ResponseWriter.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		k.ResponseWriter.WriteHeader(http.StatusOK)
		k.committed = true
		k.header = make(http.Header)
	}
	_, _ = fmt.Fprintf(k.ResponseWriter, ": %s\n\n", text)
	_ = http.NewResponseController(k.ResponseWriter).Flush()
}

func (k *keepAlive) Header() http.Header {
	if k.committed {
		return k.header
	}
	return k.ResponseWriter.Header()
}

func (k *keepAlive) WriteHeader(code int) {
	if !k.committed {
		k.ResponseWriter.WriteHeader(code)
		return
	}
	if k.status == 0 {
		k.status = code
	}
}

func (k *keepAlive) Write(b []byte) (int, error) {
	if !k.failed() {
		return k.ResponseWriter.Write(b)
	}
	k.body.Write(b[:min(len(b), max(0, maxErrorBody-k.body.Len()))])
	return len(b), nil
}

// Unwrap lets http.ResponseController reach the connection (for Flush).
func (k *keepAlive) Unwrap() http.ResponseWriter { return k.ResponseWriter }

// failed reports whether an error answer came after the commit.
func (k *keepAlive) failed() bool { return k.committed && k.status >= 300 }

// finish sends a kept error answer as the stream's last event. The handler
// calls it once, when the request is over.
func (k *keepAlive) finish() {
	if !k.failed() {
		return
	}
	_, _ = k.ResponseWriter.Write(openai.ErrorEvent(k.status, k.header.Get("Retry-After"), k.body.Bytes(), k.anthropic))
	_ = http.NewResponseController(k.ResponseWriter).Flush()
}
