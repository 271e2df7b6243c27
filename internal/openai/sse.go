package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
)

// Usage is the token count of one request, as the engine reported it.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// maxEvent bounds one SSE event held while it is incomplete.
const maxEvent = 1 << 20

// errEventTooLarge ends a stream whose event exceeds maxEvent.
var errEventTooLarge = errors.New("upstream SSE event larger than 1 MiB")

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
			return 0, s.err
		}
		if cap(s.buf)-len(s.buf) < sseReadSize/4 {
			s.buf = slices.Grow(s.buf, max(sseReadSize, len(s.buf)))
		}
		n, err := s.src.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		s.err = err
		s.split()
		if len(s.buf)-s.ready > maxEvent && (s.err == nil || s.err == io.EOF) {
			s.err = errEventTooLarge
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

// Usage is the token usage the stream reported, and whether it reported any.
// Call it once the stream has been read.
func (s *SSEReader) Usage() (Usage, bool) { return s.usage, s.counted }

// Events is the number of data events passed to the client so far, [DONE]
// and a withheld usage chunk excluded.
func (s *SSEReader) Events() int { return s.events }

// Err is the error that ended the upstream stream: nil while it runs (or
// when it was abandoned before its end), io.EOF when it ended normally.
func (s *SSEReader) Err() error { return s.err }

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
		if end > maxEvent {
			// Too large whether or not it arrived whole: the limit must not
			// depend on how the engine's bytes were chunked.
			s.err = errEventTooLarge
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
func streamError(err error) []byte {
	b, _ := json.Marshal(map[string]apiError{"error": {
		Message: "engine stream failed: " + err.Error(),
		Type:    errorType(http.StatusBadGateway),
		Code:    "engine_stream_failed",
	}})
	return append(append([]byte("data: "), b...), "\n\n"...)
}

// eventEnd returns the length of the first complete event in b (through its
// terminating blank line), or -1.
func eventEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		// A blank line follows this newline, with or without a carriage return.
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
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

// hasUsage reports whether data may hold a usage object: a "usage" key whose
// value is not null. vLLM puts "usage":null in every chunk of a stream that
// asked for usage, and decoding each of them would dominate a stream's cost.
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
	for line := range bytes.Lines(ev) {
		if rest, ok := bytes.CutPrefix(line, dataPrefix); ok {
			return bytes.TrimSpace(rest)
		}
	}
	return nil
}

// TailReader passes a body through unchanged, keeping only its last tailSize
// bytes, from which the usage of a non-streaming response is read at the end.
type TailReader struct {
	src     io.ReadCloser
	onFirst func()
	tail    []byte
	err     error // src's last error; io.EOF once the body was read whole
}

const tailSize = 16 * 1024

// NewTailReader wraps src, a JSON response body. onFirst, if not nil, is
// called once, when the first bytes are read.
func NewTailReader(src io.ReadCloser, onFirst func()) *TailReader {
	return &TailReader{src: src, onFirst: onFirst}
}

func (t *TailReader) Read(p []byte) (int, error) {
	n, err := t.src.Read(p)
	if n > 0 {
		if t.onFirst != nil {
			t.onFirst()
			t.onFirst = nil
		}
		t.tail = append(t.tail, p[:n]...)
		if over := len(t.tail) - tailSize; over > 0 {
			t.tail = append(t.tail[:0], t.tail[over:]...)
		}
	}
	if err != nil {
		t.err = err
	}
	return n, err
}

// Err is the error that ended the body: nil while it is read (or when it
// was abandoned before its end), io.EOF when it was read whole.
func (t *TailReader) Err() error { return t.err }

func (t *TailReader) Close() error { return t.src.Close() }

// Usage finds the last "usage" member holding an object in the tail. Later
// occurrences of the string "usage" that are not a key (a decoded token in
// prompt_logprobs, say) are skipped.
func (t *TailReader) Usage() (Usage, bool) {
	for i := bytes.LastIndex(t.tail, usageKey); i >= 0; i = bytes.LastIndex(t.tail[:i], usageKey) {
		rest := bytes.TrimLeft(t.tail[i+len(usageKey):], " \t\r\n")
		rest, ok := bytes.CutPrefix(rest, []byte(":"))
		if !ok {
			continue
		}
		rest = bytes.TrimLeft(rest, " \t\r\n")
		var u *Usage
		if json.Unmarshal(rest[:valueEnd(rest, 0)], &u) != nil || u == nil {
			continue
		}
		return *u, true
	}
	return Usage{}, false
}
