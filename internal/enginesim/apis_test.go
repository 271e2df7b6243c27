package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// namedEvent is one event of a stream whose events are named.
type namedEvent struct {
	name string
	data map[string]any
}

// readNamed returns the events of an SSE body in which every event is an
// event line and a data line.
func readNamed(t *testing.T, body []byte) []namedEvent {
	t.Helper()
	var events []namedEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok || !sc.Scan() {
			t.Fatalf("event line %q, then no data line", sc.Text())
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			t.Fatalf("data line %q", sc.Text())
		}
		events = append(events, namedEvent{name, decode(t, []byte(data))})
		if sc.Scan() && sc.Text() != "" {
			t.Fatalf("event not followed by a blank line: %q", sc.Text())
		}
	}
	return events
}

// The Responses API, as OpenAI's client reads it: the text and usage of a
// plain answer (input_tokens, output_tokens), bounded by max_output_tokens,
// and a stream of named events whose deltas make the same text and whose
// response.completed holds the same usage.
func TestResponses(t *testing.T) {
	_, ts := newTestServer(t)
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	params := responses.ResponseNewParams{
		Model:           "m2",
		Instructions:    openai.String("be brief"),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello there world")},
		MaxOutputTokens: openai.Int(3),
	}
	resp, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != "tok0 tok1 tok2 " || resp.Usage.InputTokens != 5 || resp.Usage.OutputTokens != 3 || resp.Usage.TotalTokens != 8 ||
		resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" || resp.Model != "m1" {
		t.Fatalf("response: %s", resp.RawJSON())
	}

	stream := client.Responses.NewStreaming(ctx, params)
	var types []string
	var text strings.Builder
	var done responses.Response
	for stream.Next() {
		e := stream.Current()
		types = append(types, e.Type)
		switch e.Type {
		case "response.output_text.delta":
			text.WriteString(e.Delta)
		case "response.completed":
			done = e.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if strings.Join(types, " ") != want {
		t.Fatalf("events %v\nwant %s", types, want)
	}
	if text.String() != "tok0 tok1 tok2 " || done.OutputText() != text.String() || done.Usage.InputTokens != 5 || done.Usage.OutputTokens != 3 {
		t.Fatalf("streamed text %q; response.completed %s", text.String(), done.RawJSON())
	}

	// Input items, and no bound: --sim-tokens.
	b := post(t, ts.URL+"/v1/responses", `{"model":"m1","input":[{"role":"user","content":[{"type":"input_text","text":"a b"}]}]}`, http.StatusOK)
	var plain struct {
		Status string
		Usage  map[string]any
	}
	if err := json.Unmarshal(b, &plain); err != nil || plain.Status != "completed" || plain.Usage["input_tokens"] != 2.0 || plain.Usage["output_tokens"] != 4.0 {
		t.Fatalf("input items: %s", b)
	}
	for body, want := range map[string]string{
		`{"model":"m1"}`: "input: Field required",
		`{"model":"m1","input":"a","max_output_tokens":0}`:   "max_output_tokens must be at least 1, got 0.",
		`{"model":"m1","input":"a","max_output_tokens":100}`: "maximum context length is 100 tokens",
	} {
		if b := post(t, ts.URL+"/v1/responses", body, http.StatusBadRequest); !strings.Contains(string(b), want) {
			t.Errorf("%s: %s, want %q", body, b, want)
		}
	}
}

// The Anthropic Messages API as vLLM serves it: a text block and usage
// (input_tokens, output_tokens) bounded by max_tokens, which is required;
// streamed, message_start holds the input tokens and message_delta both
// counts.
func TestMessages(t *testing.T) {
	_, ts := newTestServer(t)
	body := `"model":"m1","system":"be brief","messages":[{"role":"user","content":"hello there"},{"role":"assistant","content":[{"type":"text","text":"hi"}]}]`
	b := post(t, ts.URL+"/v1/messages", `{`+body+`,"max_tokens":3}`, http.StatusOK)
	m := decode(t, b)
	m["id"] = "ID"
	mustEqualJSON(t, m, `{"id":"ID","type":"message","role":"assistant","content":[{"type":"text","text":"tok0 tok1 tok2 "}],"model":"m1",
		"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":3}}`)

	b = post(t, ts.URL+"/v1/messages", `{`+body+`,"max_tokens":2,"stream":true}`, http.StatusOK)
	events := readNamed(t, b)
	var names []string
	var text strings.Builder
	for _, e := range events {
		if e.name != e.data["type"] {
			t.Fatalf("event %s of type %v", e.name, e.data["type"])
		}
		names = append(names, e.name)
		if d, ok := e.data["delta"].(map[string]any); ok && e.name == "content_block_delta" {
			text.WriteString(d["text"].(string))
		}
	}
	if want := "message_start content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"; strings.Join(names, " ") != want {
		t.Fatalf("events %v, want %s", names, want)
	}
	start, _ := json.Marshal(events[0].data["message"].(map[string]any)["usage"])
	end, _ := json.Marshal(events[5].data)
	if text.String() != "tok0 tok1 " || string(start) != `{"input_tokens":5,"output_tokens":0}` ||
		string(end) != `{"delta":{"stop_reason":"max_tokens"},"type":"message_delta","usage":{"input_tokens":5,"output_tokens":2}}` {
		t.Fatalf("text %q, message_start's usage %s, message_delta %s", text.String(), start, end)
	}

	if b := post(t, ts.URL+"/v1/messages", `{`+body+`}`, http.StatusBadRequest); !strings.Contains(string(b), "Field required: max_tokens") {
		t.Errorf("without max_tokens: %s", b)
	}
}

// Named events end their lines as every event does (--sim-sse-newline).
func TestNamedEventLineEnds(t *testing.T) {
	for newline, end := range map[string]string{"lf": "\n", "crlf": "\r\n", "cr": "\r"} {
		_, ts := newTestServer(t, "--sim-sse-newline", newline)
		for path, body := range map[string]string{
			"/v1/messages":  `{"model":"m1","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"a"}]}`,
			"/v1/responses": `{"model":"m1","max_output_tokens":1,"stream":true,"input":"a"}`,
		} {
			b := string(post(t, ts.URL+path, body, http.StatusOK))
			if !strings.HasPrefix(b, "event: ") || strings.Count(b, "event: ") != strings.Count(b, end+"data: ") ||
				strings.Count(b, "data: ") != strings.Count(b, "}"+end+end) || !strings.HasSuffix(b, end+end) {
				t.Errorf("%s, %s: %q", newline, path, b)
			}
		}
	}
}

// A pooling model serves neither.
func TestResponsesAndMessagesGenerativeOnly(t *testing.T) {
	_, ts := newTestServer(t, "--runner", "pooling")
	for _, path := range []string{"/v1/responses", "/v1/messages"} {
		if b := post(t, ts.URL+path, `{"model":"m1","input":"a","messages":[],"max_tokens":1}`, http.StatusNotFound); string(b) != `{"detail":"Not Found"}` {
			t.Errorf("%s: %s", path, b)
		}
	}
}
