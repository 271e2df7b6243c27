package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// request is what the proxy needs from an OpenAI request body, read in one pass.
type request struct {
	model     string
	modelSpan span // the model value's bytes, quotes included
	stream    bool
	// opts is the stream_options value's span; zero when absent.
	opts         span
	includeUsage bool // the client asked for usage in its stream
}

// span is a half-open byte range [from, to) of a body.
type span struct{ from, to int }

func (s span) empty() bool { return s.to == 0 }

// errBadBody is wrapped by every body parsing error (answered with 400).
var errBadBody = errors.New("invalid request body")

// parseRequest reads the top level of a JSON object body once, validating the
// whole of it, and records the fields the proxy rewrites.
func parseRequest(body []byte) (request, error) {
	var r request
	if len(bytes.TrimSpace(body)) == 0 {
		return r, fmt.Errorf("%w: the body is empty; expected a JSON object", errBadBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return r, fmt.Errorf("%w: expected a JSON object", errBadBody)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return r, fmt.Errorf("%w: %v", errBadBody, err)
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return r, fmt.Errorf("%w: %v", errBadBody, err)
		}
		end := int(dec.InputOffset())
		sp := span{end - len(raw), end}
		switch key {
		case "model":
			if err := json.Unmarshal(raw, &r.model); err != nil {
				return r, fmt.Errorf("%w: \"model\" must be a string", errBadBody)
			}
			r.modelSpan = sp
		case "stream":
			var b *bool
			if err := json.Unmarshal(raw, &b); err != nil {
				return r, fmt.Errorf("%w: \"stream\" must be a boolean", errBadBody)
			}
			r.stream = b != nil && *b
		case "stream_options":
			var o *struct {
				IncludeUsage *bool `json:"include_usage"`
			}
			if err := json.Unmarshal(raw, &o); err != nil {
				return r, fmt.Errorf("%w: \"stream_options\" must be an object", errBadBody)
			}
			r.opts = sp
			r.includeUsage = o != nil && o.IncludeUsage != nil && *o.IncludeUsage
		}
	}
	if _, err := dec.Token(); err != nil {
		return r, fmt.Errorf("%w: %v", errBadBody, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return r, fmt.Errorf("%w: unexpected data after the JSON object", errBadBody)
	}
	if r.modelSpan.empty() || r.model == "" {
		return r, fmt.Errorf("%w: \"model\" is required", errBadBody)
	}
	return r, nil
}

// rewrite returns the body to send upstream: model replaced by id when it
// differs, and, when injectUsage is set, stream_options changed so that the
// engine reports usage in a final usage-only chunk (and only there). Everything
// else is kept byte for byte. It returns body itself when nothing changes.
func rewrite(body []byte, r request, id string, injectUsage bool) []byte {
	if r.model == id && !injectUsage {
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
	if r.model != id {
		q, _ := json.Marshal(id)
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
