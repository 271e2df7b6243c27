package enginesim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// "n": 2 gives two choices; usage counts the tokens of both.
func TestNChoices(t *testing.T) {
	_, ts := newTestServer(t)
	m := decode(t, post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":3,"n":2}`, http.StatusOK))
	choices := m["choices"].([]any)
	u := m["usage"].(map[string]any)
	if len(choices) != 2 || choices[1].(map[string]any)["index"] != 1.0 || u["completion_tokens"] != 6.0 || u["total_tokens"] != 8.0 {
		t.Fatalf("chat n=2: %v", m)
	}
	m = decode(t, post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"a","max_tokens":2,"n":3}`, http.StatusOK))
	if len(m["choices"].([]any)) != 3 || m["usage"].(map[string]any)["completion_tokens"] != 6.0 {
		t.Fatalf("completion n=3: %v", m)
	}
	post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"a","n":0}`, http.StatusBadRequest)

	// Streaming: a role chunk per choice, then a chunk per token and choice.
	events := streamEvents(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":3,"n":2,"stream":true,"stream_options":{}}`)
	text := map[float64]string{}
	roles := 0
	for _, e := range events[:len(events)-2] {
		c := decode(t, []byte(e))["choices"].([]any)
		if len(c) != 1 {
			t.Fatalf("chunk with %d choices: %s", len(c), e)
		}
		ch := c[0].(map[string]any)
		delta := ch["delta"].(map[string]any)
		if delta["role"] != nil {
			roles++
			continue
		}
		text[ch["index"].(float64)] += delta["content"].(string)
	}
	if roles != 2 || text[0] != "tok0 tok1 tok2 " || text[1] != "tok0 tok1 tok2 " {
		t.Fatalf("streamed n=2: %d roles, texts %v", roles, text)
	}
	if u := decode(t, []byte(events[len(events)-2]))["usage"].(map[string]any); u["completion_tokens"] != 6.0 {
		t.Fatalf("usage chunk %s", events[len(events)-2])
	}
}

const weatherTools = `"tools":[
	{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string"}}}}},
	{"type":"function","function":{"name":"search"}}]`

// tool_choice "required" or a named function answers with a tool call in
// vLLM's shape, finish_reason "tool_calls"; "auto" needs the server's flags.
func TestToolCalls(t *testing.T) {
	_, ts := newTestServer(t)
	m := decode(t, post(t, ts.URL+"/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"tool_choice":"required",`+weatherTools+`}`, http.StatusOK))
	ch := m["choices"].([]any)[0].(map[string]any)
	msg := ch["message"].(map[string]any)
	calls := msg["tool_calls"].([]any)
	call := calls[0].(map[string]any)
	fn := call["function"].(map[string]any)
	if ch["finish_reason"] != "tool_calls" || msg["content"] != nil || len(calls) != 1 || call["type"] != "function" ||
		!strings.HasPrefix(call["id"].(string), "chatcmpl-tool-") || fn["name"] != "get_weather" {
		t.Fatalf("required: %v", m)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(fn["arguments"].(string)), &args); err != nil || args["location"] != "tok0 tok1 " {
		t.Fatalf("arguments %q: %v", fn["arguments"], err)
	}

	m = decode(t, post(t, ts.URL+"/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tool_choice":{"type":"function","function":{"name":"search"}},`+weatherTools+`}`, http.StatusOK))
	fn = m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	if fn["name"] != "search" || fn["arguments"] != `{"input": "tok0 "}` {
		t.Fatalf("named: %v", fn)
	}

	for _, tc := range []struct{ body, want string }{
		{`"tool_choice":"required"`, "When using `tool_choice`, `tools` must be set."},
		{`"tool_choice":{"type":"function","function":{"name":"nope"}},` + weatherTools, "Tool 'nope' has not been passed in `tools`."},
		{weatherTools, `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`},
	} {
		b := post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}],`+tc.body+`}`, http.StatusBadRequest)
		if msg := decode(t, b)["error"].(map[string]any)["message"]; msg != tc.want {
			t.Errorf("%s: %v, want %q", tc.body, msg, tc.want)
		}
	}

	// "auto" with the server's flags: a call when the prompt names a tool.
	_, auto := newTestServer(t, "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
	m = decode(t, post(t, auto.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"please search"}],"max_tokens":1,`+weatherTools+`}`, http.StatusOK))
	if ch := m["choices"].([]any)[0].(map[string]any); ch["finish_reason"] != "tool_calls" {
		t.Fatalf("auto, named in the prompt: %v", m)
	}
	m = decode(t, post(t, auto.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hello"}],"max_tokens":1,`+weatherTools+`}`, http.StatusOK))
	if ch := m["choices"].([]any)[0].(map[string]any); ch["finish_reason"] != "length" || ch["message"].(map[string]any)["content"] != "tok0 " {
		t.Fatalf("auto, no tool named: %v", m)
	}
}

// The official client reads the simulator's tool calls, streamed and not.
func TestToolCallsOpenAIClient(t *testing.T) {
	_, ts := newTestServer(t)
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:     "m1",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Paris?")},
		MaxTokens: openai.Int(3),
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:       "get_weather",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
		})},
		ToolChoice:    openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city": "tok0 tok1 tok2 "}` ||
		acc.Choices[0].FinishReason != "tool_calls" || acc.Usage.CompletionTokens != 3 {
		t.Fatalf("streamed tool call: %+v", acc.ChatCompletion)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if tc := resp.Choices[0].Message.ToolCalls; len(tc) != 1 || tc[0].Function.Arguments != `{"city": "tok0 tok1 tok2 "}` {
		t.Fatalf("tool call: %s", resp.RawJSON())
	}
}
