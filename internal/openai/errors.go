package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// apiError is the OpenAI error body: {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// errorType maps a status to the OpenAI error type name.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity, http.StatusRequestHeaderFieldsTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusServiceUnavailable:
		return "service_unavailable"
	default:
		return "server_error"
	}
}

// WriteError writes poold's own error answer to r: OpenAI's shape
// {"error": {"message", "type", "param", "code"}}, or on the Anthropic
// Messages route (AnthropicRoute of r's path) Anthropic's {"type": "error",
// "error": {"type", "message", "code"}}. code is the machine-readable code
// ("model_not_found", "queue_full", …); param names the offending field or
// is "" (Anthropic's shape has none: the message names it). A nil r gets
// OpenAI's shape.
func WriteError(w http.ResponseWriter, r *http.Request, status int, code, param, msg string) {
	e := apiError{Message: msg, Type: errorType(status), Code: code}
	if param != "" {
		e.Param = &param
	}
	writeError(w, r, status, e)
}

func writeError(w http.ResponseWriter, r *http.Request, status int, e apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	var body []byte
	if r != nil && AnthropicRoute(r.URL.Path) {
		body = marshal(anthropicBody(status, e))
	} else {
		body = marshal(errorBody{e})
	}
	_, _ = w.Write(append(body, '\n'))
}

// AnthropicRoute reports whether path is the Anthropic Messages API's
// route, /v1/messages, or its pinned form /pools/{pool}/v1/messages: its
// clients (Anthropic's SDKs) read errors in Anthropic's shape.
func AnthropicRoute(path string) bool {
	if rest, ok := strings.CutPrefix(path, "/pools/"); ok {
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			return false
		}
		path = rest[i:]
	}
	return path == "/v1/messages"
}

// errorBody is the OpenAI error body.
type errorBody struct {
	Error apiError `json:"error"`
}

// marshal encodes v as JSON, without a newline at the end, and without
// escaping <, > and &: messages quote what clients sent and name
// placeholders such as <key>, which must read as written.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// WriteUnavailable writes a 503 to r (see WriteError) with Retry-After in
// whole seconds (at least 1).
func WriteUnavailable(w http.ResponseWriter, r *http.Request, code, msg string, retry time.Duration) {
	setRetryAfter(w, retry)
	WriteError(w, r, http.StatusServiceUnavailable, code, "", msg)
}

// WriteRateLimited writes a 429 to r (see WriteError) with code
// rate_limit_exceeded and Retry-After in whole seconds (at least 1). In
// OpenAI's shape its type is the limit's dimension ("requests" or
// "tokens", as OpenAI names it); in Anthropic's, rate_limit_error.
func WriteRateLimited(w http.ResponseWriter, r *http.Request, dimension, msg string, retry time.Duration) {
	setRetryAfter(w, retry)
	writeError(w, r, http.StatusTooManyRequests, apiError{Message: msg, Type: dimension, Code: "rate_limit_exceeded"})
}

// setRetryAfter sets Retry-After to retry rounded up to whole seconds, at
// least 1.
func setRetryAfter(w http.ResponseWriter, retry time.Duration) {
	// Rounded up without adding to retry, which could overflow.
	secs := retry / time.Second
	if retry%time.Second > 0 {
		secs++
	}
	secs = max(1, secs)
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
}

// ErrorEvent turns an error answer (status, Retry-After, body) into the SSE
// event that ends a stream whose 200 was already sent: `data: {"error":
// {…}}`, or on the Messages route (anthropic) Anthropic's `event: error`
// with `data: {"type": "error", "error": {…}}`. A body in the route's
// shape is kept as it is (with the retry hint added to its message); any
// other body becomes the message.
func ErrorEvent(status int, retryAfter string, body []byte, anthropic bool) []byte {
	hint := ""
	if retryAfter != "" {
		hint = fmt.Sprintf(" (retry after %ss)", retryAfter)
	}
	if anthropic {
		var a anthropicError
		if err := json.Unmarshal(body, &a); err != nil || a.Type != "error" || a.Error.Type == "" || a.Error.Message == "" {
			a = anthropicBody(status, engineAnswered(status, body))
		}
		a.Error.Message += hint
		return anthropicEvent(a)
	}
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		e.Error = engineAnswered(status, body)
	}
	e.Error.Message += hint
	return dataEvent(e)
}

// engineAnswered is the error of an answer whose body is in no shape poold
// reads: the body becomes its message.
func engineAnswered(status int, body []byte) apiError {
	return apiError{
		Message: fmt.Sprintf("engine answered %d: %s", status, strings.TrimSpace(string(body))),
		Type:    errorType(status),
		Code:    "engine_error",
	}
}

// dataEvent is OpenAI's error event, `data: {"error": {…}}`.
func dataEvent(e errorBody) []byte {
	return append(append([]byte("data: "), marshal(e)...), "\n\n"...)
}

// anthropicEvent is Anthropic's error event: `event: error`, then the
// error body as its data.
func anthropicEvent(a anthropicError) []byte {
	return append(append([]byte("event: error\ndata: "), marshal(a)...), "\n\n"...)
}
