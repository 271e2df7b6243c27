// Package openai is the OpenAI-compatible wire surface that poold and fleetd
// share: reading and validating a request body once, rewriting its model and
// stream options, OpenAI-shaped errors, the SSE pass-through that reads token
// usage, request ids and API keys. It knows nothing of pools, hosts or
// engines.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultMaxBodyBytes is the default request body limit.
const DefaultMaxBodyBytes = 32 << 20

// Request is what the daemons need from an OpenAI request body, read in one
// pass. The zero value is no request.
type Request struct {
	Model  string
	Stream bool
	// IncludeUsage reports that the client asked for usage in its stream:
	// stream_options is an object whose include_usage is true or absent.
	IncludeUsage bool
	// Form reports a multipart/form-data body (an audio upload), whose
	// model, stream and stream_include_usage are form fields.
	Form bool
	// OutputCaps are the bounds on generated tokens the request sets, in
	// body order (see OutputCap); nil when it sets none.
	OutputCaps []OutputCap

	modelSpan span // the model value's bytes, quotes included (a form's: its content)
	// opts is the stream_options value's span; zero when absent.
	opts span
}

// span is a half-open byte range [from, to) of a body.
type span struct{ from, to int }

func (s span) empty() bool { return s.to == 0 }

// errBadBody is wrapped by every body parsing error (answered with 400).
var errBadBody = errors.New("invalid request body")

// fieldError is a body parsing error about one field, named in the OpenAI
// error's param.
type fieldError struct{ param, msg string }

func (e *fieldError) Error() string { return errBadBody.Error() + ": " + e.msg }
func (e *fieldError) Unwrap() error { return errBadBody }

// errParam is the field a body parsing error is about, or "".
func errParam(err error) string {
	if fe, ok := errors.AsType[*fieldError](err); ok {
		return fe.param
	}
	return ""
}

// ReadRequest reads an OpenAI request body once, bounded by limit, and
// validates it: a JSON object, or a multipart/form-data form (by its
// Content-Type). On failure it answers with the OpenAI error (400, 408 or
// 413) and returns the status sent; otherwise the status is 0.
func ReadRequest(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, Request, int) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		WriteError(w, http.StatusRequestEntityTooLarge, "body_too_large", "", fmt.Sprintf("request body exceeds the %d byte limit", limit))
		return nil, Request{}, http.StatusRequestEntityTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout: a body trickled in too slowly.
		WriteError(w, http.StatusRequestTimeout, "request_timeout", "", "reading request body: the body did not arrive within the read timeout")
		return nil, Request{}, http.StatusRequestTimeout
	case err != nil:
		WriteError(w, http.StatusBadRequest, "invalid_body", "", "reading request body: "+err.Error())
		return nil, Request{}, http.StatusBadRequest
	}
	req, err := parseBody(body, r.Header.Get("Content-Type"))
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_body", errParam(err), err.Error())
		return nil, Request{}, http.StatusBadRequest
	}
	return body, req, 0
}

// parseBody reads a body of media type contentType: a form for
// multipart/form-data, else JSON.
func parseBody(body []byte, contentType string) (Request, error) {
	if mt, params, err := mime.ParseMediaType(contentType); err == nil && mt == "multipart/form-data" {
		return parseForm(body, params["boundary"])
	}
	return parseRequest(body)
}

// parseRequest reads the top level of a JSON object body once, validating the
// whole of it, and records the fields the proxy rewrites. The body is checked
// with json.Valid and then walked by hand (only the top level's keys and value
// spans), so that only the values poold reads are decoded.
func parseRequest(body []byte) (Request, error) {
	var r Request
	if len(bytes.TrimSpace(body)) == 0 {
		return r, fmt.Errorf("%w: the body is empty; expected a JSON object", errBadBody)
	}
	if !json.Valid(body) {
		// Unmarshal names the syntax error and where it is.
		err := json.Unmarshal(body, new(json.RawMessage))
		return r, fmt.Errorf("%w: %v", errBadBody, err)
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return r, fmt.Errorf("%w: expected a JSON object", errBadBody)
	}
	for i = skipSpace(body, i+1); body[i] != '}'; i = skipSpace(body, i) {
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
		keyEnd := valueEnd(body, i)
		key := body[i:keyEnd]
		from := skipSpace(body, skipSpace(body, keyEnd)+1) // past the colon
		i = valueEnd(body, from)
		if err := r.member(key, body[from:i], span{from, i}); err != nil {
			return r, err
		}
	}
	if r.modelSpan.empty() || r.Model == "" {
		return r, &fieldError{"model", `"model" is required`}
	}
	return r, nil
}

// member records one top-level member of a valid body: key is its quoted key,
// raw its value at sp.
func (r *Request) member(key, raw []byte, sp span) error {
	if bytes.IndexByte(key, '\\') >= 0 {
		var k string
		_ = json.Unmarshal(key, &k) // valid: the body is
		key = []byte(`"` + k + `"`)
	}
	if k := string(key[1 : len(key)-1]); k != "model" && strings.EqualFold(k, "model") {
		// A case-insensitive decoder (Go's encoding/json, for one) would read
		// it as the model: poold and the engine could disagree on which.
		return &fieldError{k, fmt.Sprintf("%s is a case variant of \"model\": the model is ambiguous", strconv.Quote(k))}
	}
	if outputParams[string(key)] {
		if c, ok := outputCap(key, raw); ok {
			r.OutputCaps = append(r.OutputCaps, c)
		}
		return nil
	}
	switch string(key) {
	case `"model"`:
		if !r.modelSpan.empty() {
			return &fieldError{"model", `"model" appears more than once: the model is ambiguous`}
		}
		if raw[0] != '"' {
			return &fieldError{"model", `"model" must be a string`}
		}
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			r.Model = string(raw[1 : len(raw)-1])
		} else if err := json.Unmarshal(raw, &r.Model); err != nil {
			return &fieldError{"model", fmt.Sprintf(`"model": %v`, err)}
		}
		r.modelSpan = sp
	case `"stream"`:
		switch string(raw) {
		case "true":
			r.Stream = true
		case "false", "null":
			r.Stream = false
		default:
			return fmt.Errorf("%w: \"stream\" must be a boolean", errBadBody)
		}
	case `"stream_options"`:
		usage, err := includeUsage(raw)
		if err != nil {
			return err
		}
		r.opts = sp
		r.IncludeUsage = usage
	}
	return nil
}

// includeUsage reads a stream_options value as vLLM does: inside a present
// object, include_usage defaults to true (so {} asks for usage), while
// false or null, or stream_options null, do not ask for it. Keys match
// exactly, as in vLLM's model.
func includeUsage(raw []byte) (bool, error) {
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil {
		return false, fmt.Errorf("%w: \"stream_options\" must be an object", errBadBody)
	}
	v, set := o["include_usage"]
	if o == nil || !set {
		return o != nil, nil
	}
	var b *bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, fmt.Errorf("%w: \"stream_options.include_usage\" must be a boolean", errBadBody)
	}
	return b != nil && *b, nil
}

// skipSpace returns the index of the first byte at or after i that is not JSON
// whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd returns the end of the JSON value that starts at b[i], in a valid
// JSON text; for invalid text it returns some index up to len(b) and never
// panics.
func valueEnd(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return len(b)
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return i // the end of a number or literal before the closing bracket
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		default:
			continue
		}
		if depth == 0 {
			return i + 1
		}
	}
	return i
}

// Rewrite returns the body to send upstream: model replaced by id when it
// differs (in a form, the model field's content), and, when injectUsage is
// set, stream_options changed so that the engine reports usage in a final
// usage-only chunk (and only there); injectUsage is for JSON bodies, never
// a form. Everything else is kept byte for byte. It returns body itself when
// nothing changes.
func Rewrite(body []byte, r Request, id string, injectUsage bool) []byte {
	if r.Model == id && !injectUsage {
		return body
	}
	type patch struct {
		at   span
		with []byte
	}
	var patches []patch
	if injectUsage && r.opts.empty() {
		// Insert a member right after the opening brace.
		brace := bytes.IndexByte(body, '{')
		patches = append(patches, patch{span{brace + 1, brace + 1}, []byte(`"stream_options":{"include_usage":true},`)})
	}
	if r.Model != id {
		q := []byte(id)
		if !r.Form {
			q, _ = json.Marshal(id)
		}
		patches = append(patches, patch{r.modelSpan, q})
	}
	if injectUsage && !r.opts.empty() {
		patches = append(patches, patch{r.opts, usageOptions(body[r.opts.from:r.opts.to])})
	}
	slices.SortFunc(patches, func(a, b patch) int { return a.at.from - b.at.from })
	out := make([]byte, 0, len(body)+48)
	prev := 0
	for _, p := range patches {
		out = append(out, body[prev:p.at.from]...)
		out = append(out, p.with...)
		prev = p.at.to
	}
	return append(out, body[prev:]...)
}

// usageOptions turns a client's stream_options into one asking for the final
// usage chunk only: include_usage true, continuous_usage_stats off (the client
// did not ask for usage, so it must not see it in every chunk either), other
// members kept.
func usageOptions(raw []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		m = make(map[string]json.RawMessage)
	}
	m["include_usage"] = json.RawMessage("true")
	delete(m, "continuous_usage_stats")
	out, _ := json.Marshal(m)
	return out
}
