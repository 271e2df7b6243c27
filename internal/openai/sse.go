package openai

import (
	"bytes"
	"cmp"
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

// usageJSON is a usage object in any of the shapes vLLM reports it in:
// prompt_tokens and completion_tokens (chat, completions, embeddings and the
// pooling routes), input_tokens and output_tokens (the Responses and
// Anthropic Messages APIs), or total_tokens alone (an older rerank).
type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	InputTokens      int `json:"input_tokens"`
	OutputTokens     int `json:"output_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// counts reports whether u holds a token count: a transcription's usage
// may give its audio's duration instead, which is no usage at all.
func (u *usageJSON) counts() bool { return u != nil && *u != usageJSON{} }

// usage reads u as a Usage: total_tokens alone counts as prompt tokens.
func (u *usageJSON) usage() Usage {
	completion := cmp.Or(u.CompletionTokens, u.OutputTokens)
	return Usage{PromptTokens: cmp.Or(u.PromptTokens, u.InputTokens, max(0, u.TotalTokens-completion)), CompletionTokens: completion}
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
// It reads the usage of chat and completion streams (the usage chunk), of
// Responses streams (response.usage in response.completed) and of Anthropic
// Messages streams (the input tokens in message_start's message.usage, both
// counts in message_delta's usage).
// Every other byte passes through unchanged and in order. Events are returned as
// soon as they are complete; nothing else is held back.
//
// It reads into one buffer that grows only to fit the largest event and is
// reused for the whole stream: a stream costs no allocation per event.
type SSEReader struct {
	src      io.ReadCloser
	withhold bool
	onFirst  func() // called once, when the first bytes are returned
	onEvent  func() // see OnEvent; nil: none
	maxEvent int    // see SetMaxEvent; zero means DefaultMaxEvent
	// anthropic makes the error event that ends a broken stream
	// Anthropic's (see SetAnthropic); false: OpenAI's.
	anthropic bool

	// buf holds the bytes read from src and not yet returned: buf[off:ready]
	// are complete events to return, buf[ready:] bytes that do not yet end an
	// event, of which eventEnd has already searched the first scanned.
	buf     []byte
	off     int
	ready   int
	scanned int
	err     error // src's error, returned once the events before it are
	errSent bool  // an error event for err was queued

	// usage is the last usage the stream reported; counted reports that it
	// was a final one (not message_start's, which holds the prompt only).
	usage   Usage
	counted bool
	events  int // data events passed to the client, [DONE] excluded
	// content counts the events passed to the client that carry generated
	// text (see isContent): about one token each.
	content int
	ended   bool // Read returned io.EOF: everything reached the caller
}

// sseReadSize is the free space buf offers each read from src (and its
// initial size): an engine's events are a few hundred bytes each.
const sseReadSize = 1024

// NewSSEReader wraps src, an upstream event stream. With withhold set, the
// usage-only chunk is dropped (poold asked for it on the client's behalf).
// onFirst, if not nil, is called once, when the first bytes are returned. If
// src fails mid-stream, a final `data: {"error": …}` event (Anthropic's
// `event: error` after SetAnthropic) is returned before the error.
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
				s.buf = append(s.buf[:0], streamError(s.err, s.anthropic)...)
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
		if s.split() && s.onEvent != nil {
			s.onEvent()
		}
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

// SetAnthropic makes the error event that ends a broken stream Anthropic's
// (`event: error`, see ErrorEvent), for a stream of the Messages route.
// Call it before the first Read.
func (s *SSEReader) SetAnthropic() { s.anthropic = true }

// OnEvent makes the reader call f, after a read from src, when that read
// completed one event or more (upstream.IdleByEvents takes it as a sign
// of life). A comment counts; a blank line alone, which makes no event,
// does not. Call it before the first Read; nil: no call.
func (s *SSEReader) OnEvent(f func()) { s.onEvent = f }

func (s *SSEReader) limit() int {
	if s.maxEvent <= 0 {
		return DefaultMaxEvent
	}
	return s.maxEvent
}

func (s *SSEReader) tooLarge() error {
	return fmt.Errorf("%w: over the %d-byte limit (setting %s)", errEventTooLarge, s.limit(), MaxEventSetting)
}

// Usage is the token usage the stream reported, and whether it reported its
// final usage (a Messages stream cut after message_start has not: that holds
// the prompt only). Call it once the stream has been read.
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
// it is withheld, and reports whether it found one that is not a blank line
// alone. It resumes the search for an event's end where the last one
// stopped (less the two bytes a terminator could straddle), so an event
// arriving in many small reads costs linear time, not quadratic.
func (s *SSEReader) split() (found bool) {
	for {
		from := s.ready + max(0, s.scanned-2)
		end := eventEnd(s.buf[from:])
		if end < 0 {
			s.scanned = len(s.buf) - s.ready
			return found
		}
		end += from - s.ready
		if end > s.limit() {
			// Too large whether or not it arrived whole: the limit must not
			// depend on how the engine's bytes were chunked.
			s.err = s.tooLarge()
			return found
		}
		if c := s.buf[s.ready]; c != '\n' && c != '\r' {
			found = true
		}
		if s.keep(s.buf[s.ready : s.ready+end]) {
			s.ready += end
		} else {
			s.buf = append(s.buf[:s.ready], s.buf[s.ready+end:]...)
		}
		s.scanned = 0
	}
}

// streamError is the SSE event that ends a stream the engine broke off:
// OpenAI's, or Anthropic's for a Messages stream (anthropic; see
// ErrorEvent). A *StreamError from the upstream body gives that event its
// status, code and message; any other error is engine_stream_failed.
func streamError(err error, anthropic bool) []byte {
	status := http.StatusBadGateway
	e := apiError{Message: "engine stream failed: " + err.Error(), Type: errorType(status), Code: "engine_stream_failed"}
	if se, ok := errors.AsType[*StreamError](err); ok {
		status = se.Status
		e = apiError{Message: se.Message, Type: errorType(status), Code: se.Code}
	}
	if anthropic {
		return anthropicEvent(anthropicBody(status, e))
	}
	return dataEvent(errorBody{e})
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
	dataPrefix  = []byte("data:")
	eventPrefix = []byte("event:")
	usageKey    = []byte(`"usage"`)
	doneData    = []byte("[DONE]")
)

// usageEvent is what keep decodes of an event that may hold usage: a chat
// usage chunk's or a message_delta's usage, response.completed's
// response.usage, or message_start's message.usage.
type usageEvent struct {
	Choices  []json.RawMessage `json:"choices"`
	Usage    *usageJSON        `json:"usage"`
	Response *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"response"`
	Message *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
}

// keep records usage from one event and reports whether it goes to the client.
func (s *SSEReader) keep(ev []byte) bool {
	name, data := eventFields(ev)
	if data == nil || bytes.Equal(data, doneData) {
		return true
	}
	s.events++
	if isContent(name, data) {
		s.content++
	}
	if !hasUsage(data) {
		return true
	}
	var e usageEvent
	if json.Unmarshal(data, &e) != nil {
		return true
	}
	switch {
	case e.Usage.counts():
		u := e.Usage.usage()
		if u.PromptTokens == 0 {
			u.PromptTokens = s.usage.PromptTokens // a message_delta with output tokens only
		}
		s.usage, s.counted = u, true
	case e.Response != nil && e.Response.Usage.counts():
		s.usage, s.counted = e.Response.Usage.usage(), true
	case e.Message != nil && e.Message.Usage.counts() && !s.counted:
		// message_start: the prompt's tokens, before any are generated.
		s.usage.PromptTokens = e.Message.Usage.usage().PromptTokens
	}
	if s.withhold && e.Usage != nil && e.Choices != nil && len(e.Choices) == 0 {
		s.events--
		return false
	}
	return true
}

// contentKeys are the JSON keys whose non-empty string value is generated
// text in a chat or completion chunk or an Anthropic content_block_delta
// (text, or a tool call's partial_json).
var contentKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"arguments"`), []byte(`"partial_json"`)}

var (
	responsesEvent = []byte("response.")
	deltaKey       = []byte(`"delta"`)
)

// isContent reports whether an event, named name (nil when unnamed), carries
// generated text. The Responses API names each event by its type, and
// repeats the whole text in its .done events and in response.completed: of
// its events, only the text and tool-argument deltas count. Any other event
// counts when it holds one of contentKeys with a non-empty string value; a
// role-only or finish-only chunk does not.
func isContent(name, data []byte) bool {
	if typ, ok := bytes.CutPrefix(name, responsesEvent); ok {
		return (string(typ) == "output_text.delta" || string(typ) == "function_call_arguments.delta") && hasString(data, deltaKey)
	}
	for _, key := range contentKeys {
		if hasString(data, key) {
			return true
		}
	}
	return false
}

// hasString reports whether data holds key with a non-empty string value.
func hasString(data, key []byte) bool {
	for rest := data; ; {
		i := bytes.Index(rest, key)
		if i < 0 {
			return false
		}
		rest = rest[i+len(key):]
		v, isKey := bytes.CutPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte(":"))
		v = bytes.TrimLeft(v, " \t\r\n")
		if isKey && len(v) > 1 && v[0] == '"' && v[1] != '"' {
			return true
		}
	}
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

// eventFields returns an event's name (its event line's value) and the
// payload of its data line, each trimmed, or nil where the event has none.
// The name is read only from lines before the data line: every engine sends
// it first.
func eventFields(ev []byte) (name, data []byte) {
	for len(ev) > 0 {
		end := bytes.IndexAny(ev, "\r\n")
		if end < 0 {
			end = len(ev)
		}
		if rest, ok := bytes.CutPrefix(ev[:end], dataPrefix); ok {
			return name, bytes.TrimSpace(rest)
		}
		if rest, ok := bytes.CutPrefix(ev[:end], eventPrefix); ok {
			name = bytes.TrimSpace(rest)
		}
		ev = ev[min(end+1, len(ev)):]
	}
	return name, nil
}
