// Package openai is the OpenAI-compatible wire surface that poold and fleetd
// share: reading and validating a request body once, rewriting its model and
// stream options, poold's own errors (OpenAI's shape, Anthropic's on the
// Messages route), the SSE pass-through that reads token usage, request ids
// and API keys. It knows nothing of pools, hosts or engines.
package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
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
	// body order (see OutputCap); nil when it sets none. A null bound is
	// no bound and is not listed.
	OutputCaps []OutputCap
	// Choices is how many sequences the engine generates for the request:
	// the larger of n and best_of, 1 when neither is set (or both are
	// null); -1 when one is not a whole number of at least 1, and then
	// ChoicesParam names it.
	Choices      int64
	ChoicesParam string
	// KeepAlive is how long the client asks the engine be kept once the
	// answer ends (Ollama's keep_alive: a number of seconds or a duration
	// string), when HasKeepAlive; negative asks as long as allowed, zero a
	// release at once. A null keep_alive asks nothing.
	KeepAlive    time.Duration
	HasKeepAlive bool

	modelSpan span // the model value's bytes, quotes included (a form's: its content)
	// opts is the stream_options value's span; zero when absent.
	opts span
	// bounds are the spans of the output bound members (key through
	// value, null ones too), which a Rewrite with a Bound replaces.
	bounds []memberSpan
	// keepAlive is the keep_alive member's span (key through value);
	// zero when absent.
	keepAlive memberSpan
	// formSeen is a form's stream fields seen (bit 1:
	// stream_include_usage, 2: stream).
	formSeen uint16
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
// Content-Type). On failure it answers with poold's error (WriteError: 400,
// 408 or 413) and returns the status sent; otherwise the status is 0.
func ReadRequest(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, Request, int) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		WriteError(w, r, http.StatusRequestEntityTooLarge, "body_too_large", "", fmt.Sprintf("request body exceeds the %d byte limit", limit))
		return nil, Request{}, http.StatusRequestEntityTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The server's read timeout: a body trickled in too slowly.
		WriteError(w, r, http.StatusRequestTimeout, "request_timeout", "", "reading request body: the body did not arrive within the read timeout")
		return nil, Request{}, http.StatusRequestTimeout
	case err != nil:
		WriteError(w, r, http.StatusBadRequest, "invalid_body", "", "reading request body: "+err.Error())
		return nil, Request{}, http.StatusBadRequest
	}
	req, err := parseBody(body, r.Header.Get("Content-Type"))
	if err != nil {
		WriteError(w, r, http.StatusBadRequest, "invalid_body", errParam(err), err.Error())
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
	r := Request{Choices: 1}
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
	var seen keySet
	for i = skipSpace(body, i+1); body[i] != '}'; i = skipSpace(body, i) {
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
		keyFrom, keyEnd := i, valueEnd(body, i)
		key, err := seen.add(body[i:keyEnd], requestKeys, "")
		if err != nil {
			return r, err
		}
		from := skipSpace(body, skipSpace(body, keyEnd)+1) // past the colon
		i = valueEnd(body, from)
		if err := r.member(key, body[from:i], span{from, i}); err != nil {
			return r, err
		}
		if outputParams[key] {
			r.bounds = append(r.bounds, memberSpan{keyFrom, i})
		}
		if key == "keep_alive" {
			r.keepAlive = memberSpan{keyFrom, i}
		}
	}
	if r.modelSpan.empty() || r.Model == "" {
		return r, &fieldError{"model", `"model" is required`}
	}
	return r, nil
}

// requestKeys are the top-level members poold acts on. Each may appear
// once, spelt exactly so: a body that repeats one, or holds a case variant
// of one, is refused, since engines differ on which copy they read (Python's
// json keeps the last, Go's encoding/json matches keys without case), and
// poold must read the request as the engine will.
var requestKeys = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "keep_alive"}

// streamOptionKeys are the members of stream_options that poold acts on.
var streamOptionKeys = []string{"include_usage", "continuous_usage_stats"}

// keySet is the watched keys an object has shown so far; the zero value is
// empty.
type keySet struct{ seen uint16 } // bit i: watched[i]

// add reads the quoted key k of an object whose members poold acts on are
// watched, and returns it decoded (escapes resolved). A watched key seen
// before, or a case variant of one (as strings.EqualFold and Go's decoder
// match: "MODEL", "Max_Tokens", "ſtream"), is an error naming it; within
// is the enclosing member's name for the message ("" at the top level).
func (s *keySet) add(k []byte, watched []string, within string) (string, error) {
	key := string(k[1 : len(k)-1])
	if bytes.IndexByte(k, '\\') >= 0 {
		_ = json.Unmarshal(k, &key) // valid: the body is
	}
	for i, w := range watched {
		// A rune folds to one of at most 3 bytes: a longer key cannot match.
		if len(key) < len(w) || len(key) > 3*len(w) || !strings.EqualFold(key, w) {
			continue
		}
		name := strconv.Quote(w)
		if within != "" {
			name = strconv.Quote(within + "." + w)
		}
		switch {
		case key != w:
			return "", &fieldError{key, fmt.Sprintf("%s is a case variant of %s, which engines read differently: the request is ambiguous", strconv.Quote(key), name)}
		case s.seen&(1<<i) != 0:
			return "", &fieldError{w, fmt.Sprintf("%s appears more than once, and engines differ on which one they read: the request is ambiguous", name)}
		}
		s.seen |= 1 << i
	}
	return key, nil
}

// member records one top-level member of a valid body: key is its decoded
// key, raw its value at sp.
func (r *Request) member(key string, raw []byte, sp span) error {
	if outputParams[key] {
		if c, ok := outputCap(key, raw); ok {
			r.OutputCaps = append(r.OutputCaps, c)
		}
		return nil
	}
	switch key {
	case "model":
		if raw[0] != '"' {
			return &fieldError{"model", `"model" must be a string`}
		}
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			r.Model = string(raw[1 : len(raw)-1])
		} else if err := json.Unmarshal(raw, &r.Model); err != nil {
			return &fieldError{"model", fmt.Sprintf(`"model": %v`, err)}
		}
		r.modelSpan = sp
	case "stream":
		switch string(raw) {
		case "true":
			r.Stream = true
		case "false", "null":
			r.Stream = false
		default:
			return &fieldError{"stream", `"stream" must be a boolean`}
		}
	case "stream_options":
		usage, err := includeUsage(raw)
		if err != nil {
			return err
		}
		r.opts = sp
		r.IncludeUsage = usage
	case "keep_alive":
		d, set, err := keepAlive(raw)
		if err != nil {
			return err
		}
		r.KeepAlive, r.HasKeepAlive = d, set
	case "n", "best_of":
		if string(raw) == "null" {
			return nil
		}
		n := count(raw)
		switch {
		case n < 1:
			r.Choices, r.ChoicesParam = -1, key
		case r.Choices >= 0 && n > r.Choices:
			r.Choices, r.ChoicesParam = n, key
		}
	}
	return nil
}

// errKeepAlive refuses a keep_alive that is neither a number nor a duration.
var errKeepAlive = &fieldError{"keep_alive", `"keep_alive" must be a number of seconds or a duration string such as "10m"`}

// keepAlive reads a keep_alive value as Ollama does: a number is seconds
// (a fraction too), a string a Go duration ("10m", "-1s"); either, when
// negative, is -1 (as long as allowed). null is none (set false).
func keepAlive(raw []byte) (d time.Duration, set bool, err error) {
	switch {
	case string(raw) == "null":
		return 0, false, nil
	case raw[0] == '"':
		s := string(raw[1 : len(raw)-1])
		if bytes.IndexByte(raw, '\\') >= 0 {
			_ = json.Unmarshal(raw, &s) // valid: the body is
		}
		d, err = time.ParseDuration(s)
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		var f float64
		f, err = strconv.ParseFloat(string(raw), 64)
		switch {
		case f < 0:
			d = -1
		case f >= math.MaxInt64/float64(time.Second):
			d = math.MaxInt64
		default:
			d = time.Duration(f * float64(time.Second))
		}
	default:
		return 0, false, errKeepAlive
	}
	if err != nil {
		return 0, false, errKeepAlive
	}
	return max(d, -1), true, nil
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
	var seen keySet
	if err := eachKey(raw, func(k []byte) error {
		_, err := seen.add(k, streamOptionKeys, "stream_options")
		return err
	}); err != nil {
		return false, err
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

// Changes are what Rewrite changes in a body; the zero value changes
// nothing.
type Changes struct {
	// Model, when not "" and not the body's, replaces the body's model (in
	// a form, the model field's content).
	Model string
	// InjectUsage changes stream_options so that the engine reports usage
	// in a final usage-only chunk (and only there); for JSON bodies, never
	// a form.
	InjectUsage bool
	// Bound, when not nil, becomes the body's only output bound: every
	// output bound member it has (null ones too) gives way to it, so that
	// the engine reads exactly the bound poold enforces. JSON bodies only.
	Bound *OutputCap
	// DropKeepAlive removes the body's keep_alive member, which poold acts
	// on and engines do not know. JSON bodies only.
	DropKeepAlive bool
}

// memberSpan is a member's bytes in a body: from its key's opening quote to
// its value's end.
type memberSpan span

// Rewrite returns the body to send upstream, r's body changed as c says;
// everything else is kept byte for byte. It returns body itself when
// nothing changes.
func Rewrite(body []byte, r Request, c Changes) []byte {
	model := c.Model != "" && c.Model != r.Model
	bound := c.Bound != nil && !(len(r.bounds) == 1 && len(r.OutputCaps) == 1 && r.OutputCaps[0] == *c.Bound)
	drop := c.DropKeepAlive && !span(r.keepAlive).empty()
	if !model && !c.InjectUsage && !bound && !drop {
		return body
	}
	type patch struct {
		at   span
		with []byte
		alt  *span // a removal's other span (see removal)
	}
	var patches []patch
	brace := bytes.IndexByte(body, '{')
	if c.InjectUsage && r.opts.empty() {
		// Insert a member right after the opening brace.
		patches = append(patches, patch{at: span{brace + 1, brace + 1}, with: []byte(`"stream_options":{"include_usage":true},`)})
	}
	if bound {
		m := strconv.AppendQuote(nil, c.Bound.Param)
		m = append(strconv.AppendInt(append(m, ':'), c.Bound.N, 10), ',')
		patches = append(patches, patch{at: span{brace + 1, brace + 1}, with: m})
		for _, b := range r.bounds {
			at, alt := removal(body, b)
			patches = append(patches, patch{at: at, alt: alt})
		}
	}
	if drop {
		at, alt := removal(body, r.keepAlive)
		patches = append(patches, patch{at: at, alt: alt})
	}
	if model {
		q := []byte(c.Model)
		if !r.Form {
			q, _ = json.Marshal(c.Model)
		}
		patches = append(patches, patch{at: r.modelSpan, with: q})
	}
	if c.InjectUsage && !r.opts.empty() {
		patches = append(patches, patch{at: r.opts, with: usageOptions(body[r.opts.from:r.opts.to])})
	}
	slices.SortStableFunc(patches, func(a, b patch) int { return cmp.Or(a.at.from-b.at.from, a.at.to-b.at.to) })
	out := make([]byte, 0, len(body)+48)
	prev := 0
	for _, p := range patches {
		if p.at.from < prev && p.alt != nil {
			p.at = *p.alt // the comma before went with the member before
		}
		out = append(out, body[prev:p.at.from]...)
		out = append(out, p.with...)
		prev = p.at.to
	}
	return append(out, body[prev:]...)
}

// removal is the span to cut from body to remove the member at m with one
// of the commas beside it: the one before it, or, for the object's first
// member, the one after it; alt, when not nil, is the span that takes the
// comma after it instead, for when the one before went with a neighbour.
func removal(body []byte, m memberSpan) (at span, alt *span) {
	after := span(m)
	if j := skipSpace(body, m.to); j < len(body) && body[j] == ',' {
		after.to = skipSpace(body, j+1)
	}
	k := m.from - 1
	for k > 0 && (body[k] == ' ' || body[k] == '\t' || body[k] == '\n' || body[k] == '\r') {
		k--
	}
	if body[k] != ',' {
		return after, nil
	}
	return span{k, m.to}, &after
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
