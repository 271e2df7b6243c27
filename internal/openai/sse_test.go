package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// scriptReader returns its parts one per Read (splitting a part only when p is
// too small), then err (io.EOF when nil). With errWithLast the error comes
// with the last part's bytes instead of on the next Read.
type scriptReader struct {
	parts       [][]byte
	err         error
	errWithLast bool
	closed      bool
}

func (r *scriptReader) Read(p []byte) (int, error) {
	err := r.err
	if err == nil {
		err = io.EOF
	}
	if len(r.parts) == 0 {
		return 0, err
	}
	n := copy(p, r.parts[0])
	r.parts[0] = r.parts[0][n:]
	if len(r.parts[0]) == 0 {
		r.parts = r.parts[1:]
		if len(r.parts) == 0 && r.errWithLast {
			return n, err
		}
	}
	return n, nil
}

func (r *scriptReader) Close() error { r.closed = true; return nil }

// chunks splits b into pieces of size n (the last may be shorter).
func chunks(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

const (
	evRole    = `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1718000000,"model":"qwen","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	evHello   = `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1718000000,"model":"qwen","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	evWorld   = `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1718000000,"model":"qwen","choices":[{"index":0,"delta":{"content":" \"usage\" world\n\n"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	evFinish  = `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1718000000,"model":"qwen","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}` + "\n\n"
	evUsage   = `data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1718000000,"model":"qwen","choices":[],"usage":{"prompt_tokens":17,"total_tokens":21,"completion_tokens":4}}` + "\n\n"
	evDone    = "data: [DONE]\n\n"
	wantUsage = 17
)

// continuous-usage events: usage in every chunk, the last one being the truth.
func contEvent(content string, prompt, completion int) string {
	return `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":` +
		strings.TrimSpace(mustJSON(content)) + `,"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":` +
		itoa(prompt) + `,"total_tokens":` + itoa(prompt+completion) + `,"completion_tokens":` + itoa(completion) + "}}\n\n"
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }
func itoa(n int) string     { return mustJSON(n) }

type sseCase struct {
	name     string
	in       string
	withhold bool
	want     string
	usage    Usage
	counted  bool
	events   int
	wantErr  error // the error returned after the output (io.EOF: a clean end)
}

func sseCases() []sseCase {
	stream := evRole + evHello + evWorld + evFinish + evUsage + evDone
	crlf := strings.ReplaceAll(stream, "\n\n", "\r\n\r\n")
	cr := strings.ReplaceAll(stream, "\n", "\r")
	fields := "event: message\nid: 1\n" + strings.TrimSuffix(evHello, "\n\n")
	mixed := strings.ReplaceAll(fields, "\n", "\r") + "\r\n\n" + strings.ReplaceAll(evUsage, "\n\n", "\r\r") + evDone
	cont := contEvent("a", 5, 1) + contEvent("b", 5, 2) + contEvent("", 5, 3) +
		`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}` + "\n\n" + evDone
	noUsage := evRole + evHello + evWorld + evFinish + evDone
	return []sseCase{
		{name: "withhold", in: stream, withhold: true, want: evRole + evHello + evWorld + evFinish + evDone,
			usage: Usage{wantUsage, 4}, counted: true, events: 4, wantErr: io.EOF},
		{name: "pass through", in: stream, withhold: false, want: stream,
			usage: Usage{wantUsage, 4}, counted: true, events: 5, wantErr: io.EOF},
		{name: "crlf withhold", in: crlf, withhold: true,
			want:  strings.ReplaceAll(evRole+evHello+evWorld+evFinish+evDone, "\n\n", "\r\n\r\n"),
			usage: Usage{wantUsage, 4}, counted: true, events: 4, wantErr: io.EOF},
		{name: "crlf pass through", in: crlf, want: crlf, usage: Usage{wantUsage, 4}, counted: true, events: 5, wantErr: io.EOF},
		// The SSE format also ends lines with a lone CR.
		{name: "cr withhold", in: cr, withhold: true,
			want:  strings.ReplaceAll(evRole+evHello+evWorld+evFinish+evDone, "\n", "\r"),
			usage: Usage{wantUsage, 4}, counted: true, events: 4, wantErr: io.EOF},
		{name: "cr pass through", in: cr, want: cr, usage: Usage{wantUsage, 4}, counted: true, events: 5, wantErr: io.EOF},
		{name: "mixed line ends withhold", in: mixed, withhold: true,
			want:  strings.ReplaceAll(fields, "\n", "\r") + "\r\n\n" + evDone,
			usage: Usage{wantUsage, 4}, counted: true, events: 1, wantErr: io.EOF},
		{name: "continuous usage", in: cont, want: cont, usage: Usage{5, 3}, counted: true, events: 4, wantErr: io.EOF},
		{name: "continuous usage withheld", in: cont, withhold: true, want: strings.TrimSuffix(cont, cont[strings.LastIndex(cont[:len(cont)-len(evDone)-2], "\n\n")+2:]) + evDone,
			usage: Usage{5, 3}, counted: true, events: 3, wantErr: io.EOF},
		{name: "no usage", in: noUsage, withhold: true, want: noUsage, events: 4, wantErr: io.EOF},
		{name: "no usage pass", in: noUsage, want: noUsage, events: 4, wantErr: io.EOF},
		{name: "last event unterminated", in: evRole + "data: [DONE]", want: evRole + "data: [DONE]", events: 1, wantErr: io.EOF},
		{name: "last event unterminated, one newline", in: evRole + evHello[:len(evHello)-1], want: evRole + evHello[:len(evHello)-1], events: 2, wantErr: io.EOF},
		{name: "usage event unterminated withheld", in: evRole + strings.TrimSuffix(evUsage, "\n\n"), withhold: true, want: evRole,
			usage: Usage{wantUsage, 4}, counted: true, events: 1, wantErr: io.EOF},
		{name: "usage event unterminated passed", in: evRole + strings.TrimSuffix(evUsage, "\n"), want: evRole + strings.TrimSuffix(evUsage, "\n"),
			usage: Usage{wantUsage, 4}, counted: true, events: 2, wantErr: io.EOF},
		{name: "comments and fields", in: ": ping\n\nevent: message\nid: 3\n" + evHello + "retry: 10\n\n" + evDone,
			withhold: true, want: ": ping\n\nevent: message\nid: 3\n" + evHello + "retry: 10\n\n" + evDone, events: 1, wantErr: io.EOF},
		{name: "empty", in: "", want: "", wantErr: io.EOF},
	}
}

// readAll drains r, reading into buffers of size bufSize, and returns what it
// read and the error that ended it.
func readAll(r io.Reader, bufSize int) ([]byte, error) {
	var out []byte
	buf := make([]byte, bufSize)
	for {
		n, err := r.Read(buf)
		if n < 0 || n > len(buf) {
			panic("bad read count")
		}
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
}

// chunkings returns every way the tests feed input to the reader: whole, split
// at every byte offset into two reads, one byte per read, and small pieces.
func chunkings(in []byte) map[string]func() io.Reader {
	m := map[string]func() io.Reader{
		"whole":    func() io.Reader { return &scriptReader{parts: [][]byte{bytes.Clone(in)}} },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(in)) },
		"7 bytes":  func() io.Reader { return &scriptReader{parts: chunks(bytes.Clone(in), 7)} },
		"with EOF": func() io.Reader { return &scriptReader{parts: chunks(bytes.Clone(in), 100), errWithLast: true} },
	}
	for i := 0; i <= len(in); i++ {
		m["split "+itoa(i)] = func() io.Reader {
			return &scriptReader{parts: [][]byte{bytes.Clone(in[:i]), bytes.Clone(in[i:])}}
		}
	}
	return m
}

func TestSSEReader(t *testing.T) {
	for _, tc := range sseCases() {
		t.Run(tc.name, func(t *testing.T) {
			for how, src := range chunkings([]byte(tc.in)) {
				for _, bufSize := range []int{1, 5, 32 * 1024} {
					if bufSize == 1 && strings.HasPrefix(how, "split") {
						continue // keeps the test quick; "one byte" covers it
					}
					firsts := 0
					s := NewSSEReader(io.NopCloser(src()), tc.withhold, func() { firsts++ })
					got, err := readAll(s, bufSize)
					if string(got) != tc.want {
						t.Fatalf("%s/buf %d: output\n%q\nwant\n%q", how, bufSize, got, tc.want)
					}
					if err != tc.wantErr {
						t.Fatalf("%s/buf %d: err = %v, want %v", how, bufSize, err, tc.wantErr)
					}
					if s.usage != tc.usage || s.counted != tc.counted || s.events != tc.events {
						t.Fatalf("%s/buf %d: usage %+v counted %v events %d; want %+v %v %d",
							how, bufSize, s.usage, s.counted, s.events, tc.usage, tc.counted, tc.events)
					}
					if wantFirsts := min(1, len(tc.want)); firsts != wantFirsts {
						t.Fatalf("%s/buf %d: onFirst called %d times, want %d", how, bufSize, firsts, wantFirsts)
					}
					// A drained reader keeps answering its final error.
					if n, err2 := s.Read(make([]byte, 8)); n != 0 || err2 != err {
						t.Fatalf("%s: read after end = %d, %v", how, n, err2)
					}
				}
			}
		})
	}
}

func TestSSEReaderOnFirstBeforeEOF(t *testing.T) {
	// onFirst runs when the first bytes are returned, not when the stream ends.
	firsts := 0
	src := &scriptReader{parts: [][]byte{[]byte(evRole), []byte(evHello)}}
	s := NewSSEReader(src, true, func() { firsts++ })
	buf := make([]byte, 10)
	if n, err := s.Read(buf); n != 10 || err != nil || firsts != 1 {
		t.Fatalf("first read: %d, %v, onFirst %d times", n, err, firsts)
	}
	if _, err := io.ReadAll(s); err != nil || firsts != 1 {
		t.Fatalf("rest: %v, onFirst %d times", err, firsts)
	}
	if err := s.Close(); err != nil || !src.closed {
		t.Fatalf("Close did not close the source")
	}
}

// errorEvent checks that b is exactly one SSE error event naming cause.
func checkErrorEvent(t *testing.T, b []byte, cause string) {
	t.Helper()
	data, ok := bytes.CutPrefix(b, []byte("data: "))
	if !ok || !bytes.HasSuffix(data, []byte("\n\n")) || eventEnd(b) != len(b) {
		t.Fatalf("error event %q is not one SSE data event", b)
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("error event %q: %v", b, err)
	}
	msg, _ := e.Error["message"].(string)
	if !strings.Contains(msg, cause) || e.Error["type"] != "server_error" || e.Error["code"] != "engine_stream_failed" {
		t.Fatalf("error event %s", data)
	}
	if p, ok := e.Error["param"]; !ok || p != nil {
		t.Fatalf("error event param = %v (present %v)", p, ok)
	}
}

// A Messages stream the engine broke off, or one that poold cut with a
// StreamError, ends with Anthropic's error event.
func TestSSEReaderAnthropicError(t *testing.T) {
	boom := errors.New("connection reset by peer")
	for _, tt := range []struct {
		err  error
		want string
	}{
		{boom, `{"type":"error","error":{"type":"api_error","message":"engine stream failed: connection reset by peer","code":"engine_stream_failed"}}`},
		{&StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: "bye"},
			`{"type":"error","error":{"type":"overloaded_error","message":"bye","code":"shutting_down"}}`},
		{&StreamError{Status: http.StatusGatewayTimeout, Code: "engine_timeout", Message: "stalled"},
			`{"type":"error","error":{"type":"api_error","message":"stalled","code":"engine_timeout"}}`},
	} {
		s := NewSSEReader(&scriptReader{parts: [][]byte{[]byte(messagesStart)}, err: tt.err}, false, nil)
		s.SetAnthropic()
		got, err := readAll(s, 64)
		if !errors.Is(err, tt.err) {
			t.Fatalf("err = %v, want %v", err, tt.err)
		}
		if want := messagesStart + "event: error\ndata: " + tt.want + "\n\n"; string(got) != want {
			t.Errorf("stream %q\nwant %q", got, want)
		}
	}
}

func TestSSEReaderUpstreamError(t *testing.T) {
	boom := errors.New("connection reset by peer")
	tests := []struct {
		name        string
		src         *scriptReader
		want        string
		withLastErr bool
	}{
		{"at event boundary", &scriptReader{parts: [][]byte{[]byte(evRole + evHello), []byte(evWorld)}, err: boom}, evRole + evHello + evWorld, false},
		{"error with bytes", &scriptReader{parts: [][]byte{[]byte(evRole + evHello)}, err: boom, errWithLast: true}, evRole + evHello, true},
		// A half-received event is dropped: forwarding it would hand the
		// client a truncated JSON chunk glued to the error event.
		{"mid event", &scriptReader{parts: [][]byte{[]byte(evRole), []byte(evHello[:40])}, err: boom}, evRole, false},
		{"before anything", &scriptReader{err: boom}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			firsts := 0
			s := NewSSEReader(tt.src, true, func() { firsts++ })
			got, err := readAll(s, 7)
			if !errors.Is(err, boom) {
				t.Fatalf("err = %v, want %v", err, boom)
			}
			if !bytes.HasPrefix(got, []byte(tt.want)) {
				t.Fatalf("output %q does not start with %q", got, tt.want)
			}
			checkErrorEvent(t, got[len(tt.want):], boom.Error())
			if firsts != 1 {
				t.Fatalf("onFirst called %d times", firsts)
			}
			if n, err := s.Read(make([]byte, 8)); n != 0 || !errors.Is(err, boom) {
				t.Fatalf("read after error = %d, %v", n, err)
			}
		})
	}
}

func TestSSEReaderEventTooLarge(t *testing.T) {
	for _, limit := range []int{0, 3 << 20} { // the default, and a setting
		maxEvent := limit
		if limit == 0 {
			maxEvent = DefaultMaxEvent
		}
		big := "data: " + strings.Repeat("x", maxEvent) + "\n\n"
		almost := "data: " + strings.Repeat("y", maxEvent-len("data: \n\n")) + "\n\n"
		for _, size := range []int{100, 1500, 32 * 1024, 2 * maxEvent} {
			t.Run("limit "+itoa(maxEvent)+" read size "+itoa(size), func(t *testing.T) {
				// An event of exactly maxEvent bytes passes.
				in := evRole + almost + evDone
				s := NewSSEReader(&scriptReader{parts: chunks([]byte(in), size)}, true, nil)
				s.SetMaxEvent(limit)
				got, err := readAll(s, 32*1024)
				if err != io.EOF || string(got) != in {
					t.Fatalf("an event at the limit: err %v, output %d bytes, want %d", err, len(got), len(in))
				}
				// One byte more ends the stream.
				s = NewSSEReader(&scriptReader{parts: chunks([]byte(evRole+big+evDone), size)}, true, nil)
				s.SetMaxEvent(limit)
				got, err = readAll(s, 32*1024)
				if !errors.Is(err, errEventTooLarge) {
					t.Fatalf("err = %v, want errEventTooLarge", err)
				}
				if !bytes.HasPrefix(got, []byte(evRole)) {
					t.Fatalf("output %.100q lacks the first event", got)
				}
				checkErrorEvent(t, got[len(evRole):], "over the "+itoa(maxEvent)+"-byte limit (setting max-sse-event-bytes)")
			})
		}
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte(evRole+evHello+evWorld+evFinish+evUsage+evDone), byte(1))
	f.Add([]byte(evRole+evUsage+evDone), byte(7))
	f.Add([]byte(strings.ReplaceAll(evHello+evUsage+evDone, "\n\n", "\r\n\r\n")), byte(3))
	f.Add([]byte("data: x\n\r\n\ndata:{\"choices\":[],\"usage\":{}}\n\ndata"), byte(2))
	f.Add([]byte(contEvent("a", 1, 1)+contEvent("b", 1, 2)), byte(0))
	f.Add([]byte("\n\n\r\n\r\n\n"), byte(255))
	f.Fuzz(func(t *testing.T, in []byte, size byte) {
		n := int(size)%64 + 1
		var ref []byte
		var refUsage Usage
		var refCounted bool
		for _, withhold := range []bool{false, true} {
			firsts := 0
			s := NewSSEReader(&scriptReader{parts: chunks(bytes.Clone(in), n)}, withhold, func() { firsts++ })
			got, err := readAll(s, n+3)
			if err != io.EOF {
				t.Fatalf("err = %v", err)
			}
			if firsts != min(1, len(got)) {
				t.Fatalf("onFirst called %d times for %d bytes", firsts, len(got))
			}
			if !withhold {
				if !bytes.Equal(got, in) {
					t.Fatalf("withhold=false, chunk %d: output\n%q\nwant\n%q", n, got, in)
				}
				refUsage, refCounted = s.usage, s.counted
				continue
			}
			// Withholding drops whole events only, whatever the chunking.
			whole := NewSSEReader(io.NopCloser(bytes.NewReader(in)), true, nil)
			ref, _ = io.ReadAll(whole)
			if !bytes.Equal(got, ref) || s.usage != whole.usage || s.counted != whole.counted {
				t.Fatalf("withhold=true, chunk %d: output %q, usage %+v; single read: %q, %+v", n, got, s.usage, ref, whole.usage)
			}
			if s.usage != refUsage || s.counted != refCounted {
				t.Fatalf("usage differs with withhold: %+v/%v vs %+v/%v", s.usage, s.counted, refUsage, refCounted)
			}
			if len(got) > len(in) {
				t.Fatalf("withheld output longer than input")
			}
		}
	})
}

// A stream the engine breaks off tells why, and how many chunks with
// generated text the client received: the estimate of its completion tokens.
func TestSSEReaderCutStream(t *testing.T) {
	in := evRole + evHello + evWorld + `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments": "{\"x\""}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}` + "\n\n"
	cut := errors.New("connection reset by engine")
	s := NewSSEReader(&scriptReader{parts: [][]byte{[]byte(in)}, err: cut}, true, nil)
	out, err := io.ReadAll(s)
	if err != cut {
		t.Fatalf("read error %v, want %v", err, cut)
	}
	if !bytes.Contains(out, []byte("engine_stream_failed")) {
		t.Fatalf("no error event in %q", out)
	}
	if _, counted := s.Usage(); counted {
		t.Fatal("usage counted on a stream without usage")
	}
	if n := s.ContentChunks(); n != 3 {
		t.Fatalf("ContentChunks = %d, want 3 (two texts and a tool call's arguments; not the role or empty chunks)", n)
	}
	if s.Err() != cut {
		t.Fatalf("Err = %v, want %v", s.Err(), cut)
	}

	whole := NewSSEReader(io.NopCloser(strings.NewReader(evRole+evHello+evUsage+evDone)), true, nil)
	if _, err := io.ReadAll(whole); err != nil || whole.Err() != nil {
		t.Fatalf("a whole stream: read %v, Err %v", err, whole.Err())
	}
}

// An upstream body that fails with a *StreamError ends the stream with that
// error, not engine_stream_failed.
func TestSSEReaderStreamError(t *testing.T) {
	cut := &StreamError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: "poold is shutting down"}
	s := NewSSEReader(&scriptReader{parts: [][]byte{[]byte(evRole + evHello)}, err: cut}, false, nil)
	out, err := io.ReadAll(s)
	if err != cut {
		t.Fatalf("read error %v", err)
	}
	events := strings.Split(strings.TrimSpace(string(out)), "\n\n")
	var e struct {
		Error apiError `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(events[len(events)-1], "data: ")), &e); err != nil ||
		e.Error.Code != "shutting_down" || e.Error.Type != "service_unavailable" || e.Error.Message != "poold is shutting down" {
		t.Fatalf("last event %q (%v)", events[len(events)-1], err)
	}
}

// A Responses stream as vLLM sends it: every event named by its type, the
// text in output_text.delta events and again, whole, in the .done events and
// in response.completed, whose response.usage is the usage.
var responsesStream = `event: response.created
data: {"response":{"id":"resp_1","created_at":1,"model":"m","object":"response","output":[],"max_output_tokens":16,"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}

event: response.output_item.added
data: {"item":{"id":"msg_1","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":1,"type":"response.output_item.added"}

event: response.content_part.added
data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":2,"type":"response.content_part.added"}

event: response.output_text.delta
data: {"content_index":0,"delta":"Hello","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":3,"type":"response.output_text.delta"}

event: response.output_text.delta
data: {"content_index":0,"delta":" \"usage\": {} world","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}

event: response.output_text.done
data: {"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":5,"text":"Hello \"usage\": {} world","type":"response.output_text.done"}

event: response.content_part.done
data: {"content_index":0,"item_id":"msg_1","output_index":0,"part":{"annotations":[],"text":"Hello \"usage\": {} world","type":"output_text"},"sequence_number":6,"type":"response.content_part.done"}

event: response.output_item.done
data: {"item":{"id":"msg_1","content":[{"annotations":[],"text":"Hello \"usage\": {} world","type":"output_text"}],"role":"assistant","status":"completed","type":"message"},"output_index":0,"sequence_number":7,"type":"response.output_item.done"}

event: response.completed
data: {"response":{"id":"resp_1","created_at":1,"model":"m","object":"response","output":[{"id":"msg_1","content":[{"annotations":[],"text":"Hello \"usage\": {} world","type":"output_text"}],"role":"assistant","status":"completed","type":"message"}],"max_output_tokens":16,"status":"completed","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":11}},"sequence_number":8,"type":"response.completed"}

`

// messagesStart and messagesBody are an Anthropic Messages stream as vLLM
// sends it, the input tokens in message_start and both counts in
// message_delta.
const (
	messagesStart = "event: message_start\n" + `data: {"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}` + "\n\n"
	messagesBody  = "event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n"
	messagesDelta = "event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":9,"output_tokens":2}}` + "\n\n"
	messagesStop  = "event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
)

// The Responses and Anthropic Messages streams' usage is read from their
// own events, however the stream is split across reads, and only their text
// deltas count as generated text; a stream cut before its final usage has
// none.
func TestSSEReaderAPIs(t *testing.T) {
	// Anthropic's own API puts only the output tokens in message_delta.
	outputOnly := strings.Replace(messagesDelta, `"input_tokens":9,`, "", 1)
	for _, tc := range []struct {
		name    string
		in      string
		usage   Usage
		counted bool
		content int
	}{
		{"responses", responsesStream, Usage{9, 2}, true, 2},
		{"responses cut before response.completed", responsesStream[:strings.Index(responsesStream, "event: response.completed")], Usage{}, false, 2},
		{"responses with a tool call", strings.Replace(responsesStream, "event: response.output_text.delta\n"+`data: {"content_index":0,"delta":"Hello"`,
			"event: response.function_call_arguments.delta\n"+`data: {"content_index":0,"delta":"{\"x\""`, 1), Usage{9, 2}, true, 2},
		{"messages", messagesStart + messagesBody + messagesDelta + messagesStop, Usage{9, 2}, true, 2},
		{"messages, output tokens only in message_delta", messagesStart + messagesBody + outputOnly + messagesStop, Usage{9, 2}, true, 2},
		{"messages cut before message_delta", messagesStart + messagesBody, Usage{PromptTokens: 9}, false, 2},
		{"messages with a tool call", messagesStart + "event: content_block_delta\n" +
			`data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": "}}` + "\n\n" + messagesDelta, Usage{9, 2}, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for how, src := range chunkings([]byte(tc.in)) {
				s := NewSSEReader(io.NopCloser(src()), false, nil)
				got, err := readAll(s, 32*1024)
				if err != io.EOF || string(got) != tc.in {
					t.Fatalf("%s: err %v; the stream changed: %v", how, err, string(got) != tc.in)
				}
				if u, ok := s.Usage(); u != tc.usage || ok != tc.counted || s.ContentChunks() != tc.content {
					t.Fatalf("%s: usage %+v %v, %d content chunks; want %+v %v, %d", how, u, ok, s.ContentChunks(), tc.usage, tc.counted, tc.content)
				}
			}
		})
	}
}

// OnEvent is called after each read from the source that completed an
// event, a comment included, and not for bytes that complete none, nor
// for a blank line alone; an event that arrives in pieces counts once,
// when its blank line comes.
func TestSSEReaderOnEvent(t *testing.T) {
	for _, tt := range []struct {
		name  string
		parts []string
		want  int
	}{
		{"whole events", []string{evHello, evHello + evHello, evDone}, 3},
		{"dripped", []string{"da", "ta: {", "}\n", "\n"}, 1},
		{"no event", []string{"data: ", "x", "x", "x"}, 0},
		{"blank lines", []string{"\n", "\n\n", "\r\n\r\n"}, 0},
		{"a comment", []string{": ping\n\n"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var parts [][]byte
			for _, p := range tt.parts {
				parts = append(parts, []byte(p))
			}
			n := 0
			s := NewSSEReader(&scriptReader{parts: parts}, false, nil)
			s.OnEvent(func() { n++ })
			if _, err := io.ReadAll(s); err != nil {
				t.Fatal(err)
			}
			if n != tt.want {
				t.Fatalf("OnEvent called %d times, want %d", n, tt.want)
			}
		})
	}
}
