package openai

import (
	"bytes"
	"encoding/json"
	"io"
)

// maxUsageValue bounds the bytes of a usage object that UsageReader keeps:
// vLLM's is under a few hundred bytes, details included.
const maxUsageValue = 16 * 1024

// UsageReader passes a JSON response body through unchanged, reading as it
// goes the top-level "usage" member of the object, wherever it sits: vLLM
// puts prompt_logprobs, prompt_token_ids and kv_transfer_params after it,
// which for a long prompt run to megabytes. It holds no more of the body
// than the usage object itself (at most maxUsageValue bytes), and finds
// none in a body that is not a JSON object.
type UsageReader struct {
	src     io.ReadCloser
	onFirst func()
	err     error // src's error other than io.EOF
	ended   bool  // src returned io.EOF
	drain   int64 // see SetDrain
	scan    usageScanner
}

// NewUsageReader wraps src, a JSON response body. onFirst, if not nil, is
// called once, when the first bytes are read.
func NewUsageReader(src io.ReadCloser, onFirst func()) *UsageReader {
	return &UsageReader{src: src, onFirst: onFirst}
}

func (u *UsageReader) Read(p []byte) (int, error) {
	n, err := u.src.Read(p)
	switch {
	case err == io.EOF:
		u.ended = true
	case err != nil:
		u.err = err
	}
	if n > 0 {
		if u.onFirst != nil {
			u.onFirst()
			u.onFirst = nil
		}
		u.scan.write(p[:n])
	}
	return n, err
}

// SetDrain makes Close read up to n more bytes of a body not read to its
// end (its client left), so that its usage is still found; n ≤ 0, the
// default: none.
func (u *UsageReader) SetDrain(n int64) { u.drain = n }

// Close closes the body, after reading what is left of it as SetDrain says.
func (u *UsageReader) Close() error {
	if u.drain > 0 && !u.ended && u.err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(u, u.drain))
	}
	return u.src.Close()
}

// Err is the error that ended the body before its end (an engine that
// promised more bytes than it sent, say), or nil.
func (u *UsageReader) Err() error { return u.err }

// Ended reports whether the whole body was read.
func (u *UsageReader) Ended() bool { return u.ended }

// Usage is the top-level usage the body held (in any of the shapes vLLM
// reports it in: chat's, the Responses and Messages APIs', the pooling
// routes'), and whether it held one (an object with a token count, not
// null). Call it once the body has been read.
func (u *UsageReader) Usage() (Usage, bool) { return u.scan.usage, u.scan.found }

// usageScanner follows the structure of a JSON text fed to it in pieces,
// far enough to know the keys of the top-level object, and keeps the value
// of its "usage" member. It assumes nothing of what it is fed: invalid JSON
// yields no usage, never a panic.
type usageScanner struct {
	depth     int  // of nesting: 1 inside the top-level object
	inString  bool // within a string
	escaped   bool // the last byte was a backslash within a string
	expectKey bool // at depth 1, the next string is a key
	readKey   bool // reading a key at depth 1
	key       []byte
	isUsage   bool // the last key read at depth 1 was "usage"
	capturing bool // keeping the usage member's value
	value     []byte
	usage     Usage
	found     bool
}

func (s *usageScanner) write(p []byte) {
	for len(p) > 0 {
		if s.inString && !s.escaped && !s.readKey && !s.capturing {
			// Inside a string nothing counts but its end or an escape:
			// skip to the next quote or backslash at once.
			end := bytes.IndexByte(p, '"')
			if end < 0 {
				end = len(p)
			}
			if esc := bytes.IndexByte(p[:end], '\\'); esc >= 0 {
				end = esc
			}
			if p = p[end:]; len(p) == 0 {
				return
			}
		}
		s.step(p[0])
		p = p[1:]
	}
}

func (s *usageScanner) step(c byte) {
	if s.inString {
		switch {
		case s.escaped:
			s.escaped = false
		case c == '\\':
			s.escaped = true
		case c == '"':
			s.inString = false
			if s.readKey {
				s.readKey = false
				s.isUsage = string(s.key) == "usage"
			}
		}
		if s.readKey && len(s.key) <= len("usage") {
			s.key = append(s.key, c)
		}
		s.keep(c)
		return
	}
	if s.capturing && s.depth == 1 && (c == ',' || c == '}') {
		s.finish()
	}
	switch c {
	case '"':
		s.inString = true
		if s.depth == 1 && s.expectKey {
			s.readKey, s.key = true, s.key[:0]
		}
	case '{', '[':
		s.depth++
		s.expectKey = s.depth == 1 && c == '{'
	case '}', ']':
		s.depth--
	case ',':
		s.expectKey = s.depth == 1
	case ':':
		if s.depth == 1 {
			s.expectKey = false
			if s.isUsage {
				s.isUsage, s.capturing, s.value = false, true, s.value[:0]
				return
			}
		}
	}
	s.keep(c)
}

// keep adds c to the usage value being captured, giving it up past
// maxUsageValue.
func (s *usageScanner) keep(c byte) {
	if !s.capturing {
		return
	}
	if len(s.value) == maxUsageValue {
		s.capturing, s.value = false, nil
		return
	}
	s.value = append(s.value, c)
}

// finish decodes the captured usage value; the last one wins.
func (s *usageScanner) finish() {
	s.capturing = false
	var u *usageJSON
	if json.Unmarshal(bytes.TrimSpace(s.value), &u) == nil && u.counts() {
		s.usage, s.found = u.usage(), true
	}
}
