package openai

import (
	"bytes"
	"fmt"
	"mime"
	"strings"
)

// A multipart/form-data body (audio transcriptions and translations) is read
// where it lies: parseForm walks its parts by their delimiters and decodes
// only the headers and the few fields poold reads, so that the file in it is
// never copied. The parts must be delimited by CRLF, as RFC 2046 says and
// every HTTP client does.

// parseForm reads the form body delimited by boundary: its model field
// (required, once), and its stream and stream_include_usage fields when
// present, as the engine reads them.
func parseForm(body []byte, boundary string) (Request, error) {
	r := Request{Form: true}
	if boundary == "" || len(boundary) > 70 {
		return r, fmt.Errorf("%w: multipart/form-data needs a boundary of 1 to 70 characters", errBadBody)
	}
	delim := []byte("\r\n--" + boundary)
	// The first delimiter may open the body, without the CRLF before it.
	i := bytes.Index(body, delim)
	if bytes.HasPrefix(body, delim[2:]) {
		i = -2
	}
	if i == -1 {
		return r, fmt.Errorf("%w: multipart body without its boundary", errBadBody)
	}
	for i += len(delim); ; {
		if bytes.HasPrefix(body[i:], []byte("--")) {
			break // the close delimiter: what follows is an epilogue
		}
		for i < len(body) && (body[i] == ' ' || body[i] == '\t') {
			i++ // transport padding
		}
		if !bytes.HasPrefix(body[i:], []byte("\r\n")) {
			return r, fmt.Errorf("%w: multipart body: a boundary line ends with something else than CRLF", errBadBody)
		}
		i += 2
		headers, content, next, err := formPart(body, i, delim)
		if err != nil {
			return r, err
		}
		if err := r.formField(headers, content, span{i + len(headers), i + len(headers) + len(content)}); err != nil {
			return r, err
		}
		i = next
	}
	if r.modelSpan.empty() || r.Model == "" {
		return r, &fieldError{"model", `the form field "model" is required`}
	}
	return r, nil
}

// formPart splits the part that starts at body[i] into its header block
// (with its blank line) and its content, and returns where the delimiter
// after it ends.
func formPart(body []byte, i int, delim []byte) (headers, content []byte, next int, err error) {
	h := 0
	if !bytes.HasPrefix(body[i:], []byte("\r\n")) { // a part without headers starts with the blank line
		if h = bytes.Index(body[i:], []byte("\r\n\r\n")); h < 0 {
			return nil, nil, 0, fmt.Errorf("%w: multipart body: a part's headers do not end", errBadBody)
		}
		h += 2
	}
	headers = body[i : i+h+2]
	n := bytes.Index(body[i+len(headers):], delim)
	if n < 0 {
		return nil, nil, 0, fmt.Errorf("%w: multipart body: a part does not end with the boundary", errBadBody)
	}
	content = body[i+len(headers) : i+len(headers)+n]
	return headers, content, i + len(headers) + n + len(delim), nil
}

// formField records one part of a form: headers is its header block,
// content its bytes at sp. A part whose name cannot be read is not one of
// the fields poold reads: the engine judges it.
func (r *Request) formField(headers, content []byte, sp span) error {
	name := ""
	for line := range strings.SplitSeq(string(headers), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "Content-Disposition") {
			continue
		}
		if disp, params, err := mime.ParseMediaType(v); err == nil && disp == "form-data" {
			name = params["name"]
		}
	}
	switch name {
	case "model":
		if !r.modelSpan.empty() {
			return &fieldError{"model", `the form field "model" appears more than once: the model is ambiguous`}
		}
		r.Model, r.modelSpan = string(content), sp
	case "stream", "stream_include_usage":
		bit := uint16(1)
		if name == "stream" {
			bit = 2
		}
		if r.formSeen&bit != 0 {
			return &fieldError{name, fmt.Sprintf("the form field %q appears more than once: the request is ambiguous", name)}
		}
		r.formSeen |= bit
		b, ok := formBool(string(content))
		if !ok {
			return &fieldError{name, fmt.Sprintf("the form field %q must be a boolean", name)}
		}
		if name == "stream" {
			r.Stream = b
		} else {
			r.IncludeUsage = b
		}
	}
	return nil
}

// formBool reads a boolean form value as the engine's request validation
// (pydantic) does.
func formBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "1", "on", "t", "true", "y", "yes":
		return true, true
	case "0", "off", "f", "false", "n", "no":
		return false, true
	}
	return false, false
}
