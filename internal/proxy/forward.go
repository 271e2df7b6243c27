package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/upstream"
)

// rewriteOut builds the upstream request: the engine's URL, the rewritten body,
// and the client's headers but those poold owns (its credentials among them:
// engines are not meant to see API keys) and the hop-by-hop ones.
func (h *Handler) rewriteOut(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	out := pr.Out
	out.URL.Scheme = x.lease.Target.Scheme
	out.URL.Host = x.lease.Target.Host
	out.URL.Path = x.path
	out.URL.RawPath = ""
	out.Host = ""
	upstream.SetBody(out, x.body)
	dropOwned(out.Header)
	// vLLM refuses a JSON route's body unless it comes as application/json
	// (curl -d sends a form's type, many clients none); poold read it as a
	// JSON object, so it says so. A form keeps its type: the boundary is in it.
	if !x.form {
		out.Header.Set("Content-Type", "application/json")
	}
	// The engine takes it as its own request id (vLLM does), so that its
	// log lines match the access log's.
	out.Header.Set("X-Request-Id", x.id)
}

// modifyResponse wraps the engine's response body to count tokens and, for
// streams where poold asked for usage, withhold the usage-only chunk.
func (h *Handler) modifyResponse(resp *http.Response) error {
	x := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	// The client has poold's X-Request-Id already; an engine's echo of it
	// (vLLM's --enable-request-id-headers) would be a second.
	resp.Header.Del("X-Request-Id")
	raw := resp.Body // the Transport's, which IdleByEvents knows
	resp.Body = &engineBody{ReadCloser: resp.Body, x: x}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		x.sse = openai.NewSSEReader(resp.Body, x.withhold, x.markFirst)
		x.sse.SetMaxEvent(int(h.opts.MaxEventBytes))
		if openai.AnthropicRoute(x.path) {
			x.sse.SetAnthropic()
		}
		x.sse.OnEvent(upstream.IdleByEvents(raw))
		resp.Body = h.timeStream(x, x.sse)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	x.plain.Store(true)
	if resp.StatusCode >= 400 {
		reshapeError(resp, openai.AnthropicRoute(x.path))
	}
	x.tail = openai.NewUsageReader(resp.Body, x.markFirst)
	x.tail.SetDrain(maxDrain)
	resp.Body = x.tail
	return nil
}

// reshapeError gives an engine's JSON error answer the shape of poold's
// own errors (openai.EngineError; Anthropic's on the Messages route), so
// that a client reads one shape whoever refused it. It reads at most
// maxErrorBody of the body: a larger one, one that fails, or one encoded,
// goes on as the engine sent it.
func reshapeError(resp *http.Response, anthropic bool) {
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" || resp.Header.Get("Content-Encoding") != "" {
		return
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody+1))
	if err != nil || len(head) > maxErrorBody {
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
		return
	}
	body, _ := openai.EngineError(resp.StatusCode, head, anthropic)
	resp.Body = readCloser{bytes.NewReader(body), resp.Body}
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
}

// readCloser reads from one reader and closes another: a body read ahead.
type readCloser struct {
	io.Reader
	io.Closer
}

// maxDrain bounds what is read of a plain answer after its client left, for
// its usage: vLLM puts the usage before prompt_logprobs and the prompt's
// token ids, which can run to megabytes.
const maxDrain = 8 << 20

// upstreamError answers a request whose engine could not be reached or failed
// before sending a response.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := r.Context().Value(exchangeKey{}).(*exchange)
	if context.Cause(r.Context()) == errShutdownCut {
		openai.WriteUnavailable(w, r, "shutting_down", errShutdownCut.Error(), shutdownRetry)
		return
	}
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	h.log.Warn("engine request failed", "pool", x.lease.Pool, "profile", x.lease.Profile.ID, "err", err)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		openai.WriteError(w, r, http.StatusGatewayTimeout, "engine_timeout", "", fmt.Sprintf("engine for %q did not answer in time: %v", x.lease.Profile.ID, err))
		return
	}
	openai.WriteError(w, r, http.StatusBadGateway, "engine_unavailable", "", fmt.Sprintf("engine for %q failed: %v", x.lease.Profile.ID, err))
}

// statusWriter remembers the status written through it. It forwards Flush and
// Unwrap so that streaming keeps working.
type statusWriter struct {
	http.ResponseWriter
	status *int
}

func (s *statusWriter) WriteHeader(code int) {
	if *s.status == 0 {
		*s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if *s.status == 0 {
		*s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() { http.NewResponseController(s.ResponseWriter).Flush() }

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// shutdownRetry is the Retry-After of answers refused or cut by a shutdown:
// another poold (or this one, restarted) may serve by then.
const shutdownRetry = 5 * time.Second

// engineBody is an engine's response body. When it fails because poold's
// shutdown cut it, or because the engine stalled (no complete event of a
// stream, or no byte of a plain body, for the stream idle timeout: the
// engine is then reported failed to its pool), it fails
// with the stream error that tells the client why (see openai.StreamError).
type engineBody struct {
	io.ReadCloser
	x *exchange
}

func (b *engineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil || err == io.EOF:
	case context.Cause(b.x.ctx) == errShutdownCut:
		err = &openai.StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: errShutdownCut.Error()}
	case errors.Is(err, upstream.ErrBodyIdle):
		b.x.lease.Fail(fmt.Errorf("engine stalled while serving: %w", err))
		err = &openai.StreamError{Status: http.StatusGatewayTimeout, Code: "engine_timeout",
			Message: fmt.Sprintf("the engine for %q stalled: %v; it is being restarted", b.x.lease.Profile.ID, err)}
	}
	return n, err
}
