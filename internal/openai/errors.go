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

// WriteError writes an OpenAI-shaped error. code is the machine-readable code
// ("model_not_found", "queue_full", …); param names the offending field or is "".
func WriteError(w http.ResponseWriter, status int, code, param, msg string) {
	e := apiError{Message: msg, Type: errorType(status), Code: code}
	if param != "" {
		e.Param = &param
	}
	writeError(w, status, e)
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(marshal(errorBody{e}), '\n'))
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

// WriteUnavailable writes a 503 with Retry-After in whole seconds (at least 1).
func WriteUnavailable(w http.ResponseWriter, code, msg string, retry time.Duration) {
	setRetryAfter(w, retry)
	WriteError(w, http.StatusServiceUnavailable, code, "", msg)
}

// WriteRateLimited writes OpenAI's 429: code rate_limit_exceeded, type the
// limit's dimension ("requests" or "tokens", as OpenAI names it), and
// Retry-After in whole seconds (at least 1).
func WriteRateLimited(w http.ResponseWriter, dimension, msg string, retry time.Duration) {
	setRetryAfter(w, retry)
	writeError(w, http.StatusTooManyRequests, apiError{Message: msg, Type: dimension, Code: "rate_limit_exceeded"})
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
// event `data: {"error": {…}}`, for a stream whose 200 was already sent. An
// OpenAI-shaped body is kept as it is (with the retry hint added to its
// message); any other body becomes the message.
func ErrorEvent(status int, retryAfter string, body []byte) []byte {
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		e.Error = apiError{
			Message: fmt.Sprintf("engine answered %d: %s", status, strings.TrimSpace(string(body))),
			Type:    errorType(status),
			Code:    "engine_error",
		}
	}
	if retryAfter != "" {
		e.Error.Message += fmt.Sprintf(" (retry after %ss)", retryAfter)
	}
	return append(append([]byte("data: "), marshal(e)...), "\n\n"...)
}
