package proxy

import (
	"io"
	"net/http"
	"net/http/httputil"
	"time"
)

// This file exports the pieces of the proxy that fleetd reuses to forward
// requests to poold hosts, so that body parsing, OpenAI error bodies and SSE
// pass-through exist once.

// ParseRequest reads the model and stream fields of an OpenAI request body,
// validating the body's top level as poold does; its errors are meant for a 400.
func ParseRequest(body []byte) (model string, stream bool, err error) {
	r, err := parseRequest(body)
	return r.model, r.stream, err
}

// WriteError writes an OpenAI-shaped error body with status. code is the
// machine-readable code; param names the offending field or is "".
func WriteError(w http.ResponseWriter, status int, code, param, msg string) {
	writeError(w, status, code, param, msg)
}

// WriteUnavailable writes a 503 with Retry-After in whole seconds (at least 1).
func WriteUnavailable(w http.ResponseWriter, code, msg string, retry time.Duration) {
	writeUnavailable(w, code, msg, retry)
}

// NewSSEPassthrough wraps an upstream event stream: each complete event is
// returned as soon as it arrives, and if the upstream fails mid-stream a final
// `data: {"error": …}` event is returned before the error. onFirst, if not nil,
// is called once, when the first bytes are returned.
func NewSSEPassthrough(src io.ReadCloser, onFirst func()) io.ReadCloser {
	return newSSEReader(src, false, onFirst)
}

// NewBufferPool returns the small, pooled copy buffers poold's ReverseProxy
// uses, for another ReverseProxy (httputil.BufferPool).
func NewBufferPool() httputil.BufferPool { return new(bufferPool) }
