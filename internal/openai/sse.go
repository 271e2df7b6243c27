package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
)

// Usage is the token count of one request, as the engine reported it.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// DefaultMaxEvent bounds, unless SetMaxEvent says otherwise, one SSE event
// held while it is incomplete.
const DefaultMaxEvent = 1 << 20

// errEventTooLarge ends a stream whose event exceeds the reader's limit.
var errEventTooLarge = errors.New("an event from upstream is too large")

// MaxEventSetting is the daemons' setting of the SSE event limit, named in
// the error event of a stream cut for it.
const MaxEventSetting = "max-sse-event-bytes"

// SSEReader passes an upstream SSE stream through event by event, reading usage
// from the events that carry it and, when withhold is set, dropping the final
// usage-only chunk (`"choices": []`) that poold asked for on the client's behalf.
// Every other byte passes through unchanged and in order. Events are returned as
// soon as they are complete; nothing else is held back.
//
// It reads into one buffer that grows only to fit the largest event and is
// reused for the whole stream: a stream costs no allocation per event.
type SSEReader struct {
	src      io.ReadCloser
	withhold bool
	onFirst  func() // called once, when the first bytes are returned
	maxEvent int    // see SetMaxEvent; zero means DefaultMaxEvent

	// buf holds the bytes read from src and not yet returned: buf[off:ready]
	// are complete events to return, buf[ready:] bytes that do not yet end an
	// event, of which eventEnd has already searched the first scanned.
	buf     []byte
	off     int
	ready   int
	scanned int
	err     error // src's error, returned once the events before it are
	errSent bool  // an error event for err was queued

	usage   Usage
	counted bool // usage was seen
	events  int  // data events passed to the client, [DONE] excluded
	// content counts the events passed to the client that carry generated
	// text (content, text or tool-call arguments): about one token each.
	content int
	ended   bool // Read returned io.EOF: everything reached the caller
}

// sseReadSize is the free space buf offers each read from src (and its
// initial size): an engine's events are a few hundred bytes each.
const sseReadSize = 1024

// NewSSEReader wraps src, an upstream event stream. With withhold set, the
// usage-only chunk is dropped (poold asked for it on the client's behalf).
// onFirst, if not nil, is called once, when the first bytes are returned. If
// src fails mid-stream, a final `data: {"error": …}` event is returned before
// the error.
func NewSSEReader(src io.ReadCloser, withhold bool, onFirst func()) *SSEReader {
	return &SSEReader{src: src, withhold: withhold, onFirst: onFirst}
}

func (s *SSEReader) Read(p []byte) (int, error) {
	for s.off == s.ready {
		if s.off > 0 {
			// Everything complete was returned: keep only the incomplete rest.
			s.buf = s.buf[:copy(s.buf, s.buf[s.off:])]
			s.off, s.ready = 0, 0
		}
		if s.err != nil {
			if len(s.buf) > 0 && s.err == io.EOF {
				// A last event without its blank line: pass it on as it is,
				// once its usage, if any, is read.
				if s.keep(s.buf) {
					s.ready = len(s.buf)
					break
				}
				s.buf = s.buf[:0]
				continue
			}
			if s.err != io.EOF && !s.errSent {
				// The engine failed mid-stream: tell the client in the stream
				// itself before the connection is cut (an incomplete event is
				// dropped, not glued to the error).
				s.errSent = true
				s.buf = append(s.buf[:0], streamError(s.err)...)
				s.ready = len(s.buf)
				break
			}
			s.ended = s.err == io.EOF
			return 0, s.err
		}
		if cap(s.buf)-len(s.buf) < sseReadSize/4 {
			s.buf = slices.Grow(s.buf, max(sseReadSize, len(s.buf)))
		}
		n, err := s.src.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		s.err = err
		s.split()
		if len(s.buf)-s.ready > s.limit() && (s.err == nil || s.err == io.EOF) {
			s.err = s.tooLarge()
		}
	}
	if s.onFirst != nil {
		s.onFirst()
		s.onFirst = nil
	}
	n := copy(p, s.buf[s.off:s.ready])
	s.off += n
	return n, nil
}

func (s *SSEReader) Close() error { return s.src.Close() }

// SetMaxEvent bounds each event held while incomplete to n bytes (n ≤ 0:
// DefaultMaxEvent); a larger one ends the stream with an error event that
// names the limit and MaxEventSetting. Call it before the first Read.
func (s *SSEReader) SetMaxEvent(n int) { s.maxEvent = n }

func (s *SSEReader) limit() int {
	if s.maxEvent <= 0 {
		return DefaultMaxEvent
	}
	return s.maxEvent
}

func (s *SSEReader) tooLarge() error {
	return fmt.Errorf("%w: over the %d-byte limit (setting %s)", errEventTooLarge, s.limit(), MaxEventSetting)
}

// Usage is the token usage the stream reported, and whether it reported any.
// Call it once the stream has been read.
func (s *SSEReader) Usage() (Usage, bool) { return s.usage, s.counted }

// ContentChunks counts the chunks passed to the client that carried
// generated text: for a stream that ended without usage (cut or abandoned),
// an estimate of the completion tokens the client received.
func (s *SSEReader) ContentChunks() int { return s.content }

// Ended reports whether the whole stream was read: the upstream ended it and
// every byte was returned.
func (s *SSEReader) Ended() bool { return s.ended }

// Err is the error that ended the upstream stream before its end (the
// engine broke it off, or an event was too large), or nil.
func (s *SSEReader) Err() error {
	if s.err == io.EOF {
		return nil
	}
	return s.err
}

// split marks every complete event after buf[:ready] ready, or removes it when
// it is withheld. It resumes the search for an event's end where the last one
// stopped (less the two bytes a terminator could straddle), so an event
// arriving in many small reads costs linear time, not quadratic.
func (s *SSEReader) split() {
	for {
		from := s.ready + max(0, s.scanned-2)
		end := eventEnd(s.buf[from:])
		if end < 0 {
			s.scanned = len(s.buf) - s.ready
			return
		}
		end += from - s.ready
		if end > s.limit() {
			// Too large whether or not it arrived whole: the limit must not
			// depend on how the engine's bytes were chunked.
			s.err = s.tooLarge()
			return
		}
		if s.keep(s.buf[s.ready : s.ready+end]) {
			s.ready += end
		} else {
			s.buf = append(s.buf[:s.ready], s.buf[s.ready+end:]...)
		}
		s.scanned = 0
	}
}

// streamError is the SSE event that ends a stream the engine broke off.
// A *StreamError from the upstream body gives that event its status, code
// and message; any other error is engine_stream_failed.
func streamError(err error) []byte {
	e := apiError{Message: "engine stream failed: " + err.Error(), Type: errorType(http.StatusBadGateway), Code: "engine_stream_failed"}
	if se, ok := errors.AsType[*StreamError](err); ok {
		e = apiError{Message: se.Message, Type: errorType(se.Status), Code: se.Code}
	}
	return append(append([]byte("data: "), marshal(errorBody{e})...), "\n\n"...)
}

// StreamError is why a stream was ended early by the proxy rather than by
// the engine (poold's shutdown, say): an upstream body that fails with it
// makes SSEReader end the stream with this error event instead of
// engine_stream_failed.
type StreamError struct {
	Status  int    // the HTTP status the error would have had, for its type
	Code    string // the machine-readable code
	Message string
}

func (e *StreamError) Error() string { return e.Message }

// eventEnd returns the length of the first complete event in b (through its
// terminating blank line), or -1. Lines end with LF, CRLF or a lone CR, as
// the SSE format allows; a CR at the very end of b may be half of a CRLF, so
// the search waits for the next byte before deciding on it.
func eventEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		n := lineEnd(b, i)
		if n == 0 {
			continue
		}
		if n < 0 {
			return -1
		}
		// A blank line: another line end right after this one.
		if m := lineEnd(b, i+n); m != 0 {
			if m < 0 {
				return -1
			}
			return i + n + m
		}
		i += n - 1
	}
	return -1
}

// lineEnd returns the length of the line end at b[i] (1 for LF or a lone CR,
// 2 for CRLF), 0 when b[i] ends no line, and -1 when it cannot tell yet: i is
// past the end of b, or b[i] is a CR that b's last byte.
func lineEnd(b []byte, i int) int {
	switch {
	case i >= len(b):
		return -1
	case b[i] == '\n':
		return 1
	case b[i] != '\r':
		return 0
	case i+1 >= len(b):
		return -1
	case b[i+1] == '\n':
		return 2
	}
	return 1
}

var (
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage"`)
	doneData   = []byte("[DONE]")
)

// keep records usage from one event and reports whether it goes to the client.
func (s *SSEReader) keep(ev []byte) bool {
	data := eventData(ev)
	if data == nil || bytes.Equal(data, doneData) {
		return true
	}
	s.events++
	if hasContent(data) {
		s.content++
	}
	if !hasUsage(data) {
		return true
	}
	var chunk struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *Usage            `json:"usage"`
	}
	if json.Unmarshal(data, &chunk) != nil || chunk.Usage == nil {
		return true
	}
	s.usage, s.counted = *chunk.Usage, true
	if s.withhold && chunk.Choices != nil && len(chunk.Choices) == 0 {
		s.events--
		return false
	}
	return true
}

// contentKeys are the JSON keys whose non-empty string value is generated
// text in a chat or completion chunk.
var contentKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"arguments"`)}

// hasContent reports whether a chunk carries generated text: one of
// contentKeys with a non-empty string value. A role-only or finish-only
// chunk does not.
func hasContent(data []byte) bool {
	for _, key := range contentKeys {
		for rest := data; ; {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			v, isKey := bytes.CutPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte(":"))
			v = bytes.TrimLeft(v, " \t\r\n")
			if isKey && len(v) > 1 && v[0] == '"' && v[1] != '"' {
				return true
			}
		}
	}
	return false
}

// hasUsage reports whether data may hold a usage object: a "usage" key whose
// value is not null. Current vLLM leaves the key out of every chunk but the
// usage chunk; older versions put "usage":null in each, and decoding each of
// them would dominate a stream's cost.
func hasUsage(data []byte) bool {
	for {
		i := bytes.Index(data, usageKey)
		if i < 0 {
			return false
		}
		data = data[i+len(usageKey):]
		rest, isKey := bytes.CutPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte(":"))
		if isKey && !bytes.HasPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte("null")) {
			return true
		}
	}
}

// eventData returns the payload of an event's data line, trimmed, or nil.
func eventData(ev []byte) []byte {
	for len(ev) > 0 {
		end := bytes.IndexAny(ev, "\r\n")
		if end < 0 {
			end = len(ev)
		}
		if rest, ok := bytes.CutPrefix(ev[:end], dataPrefix); ok {
			return bytes.TrimSpace(rest)
		}
		ev = ev[min(end+1, len(ev)):]
	}
	return nil
}
