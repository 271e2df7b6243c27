package enginesim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// streamEvents posts a streaming request and returns its data payloads,
// [DONE] included.
func streamEvents(t *testing.T, url, body string) []string {
	t.Helper()
	b := post(t, url, body, http.StatusOK)
	return readEvents(t, bytes.NewReader(b))
}

// Inside a present stream_options, include_usage defaults to true; chunks
// other than the usage chunk carry no usage key, or "usage": null with
// --sim-usage-null (older vLLM).
func TestStreamOptionsUsage(t *testing.T) {
	for _, usageNull := range []bool{false, true} {
		var extra []string
		if usageNull {
			extra = []string{"--sim-usage-null"}
		}
		_, ts := newTestServer(t, extra...)
		for _, tc := range []struct {
			opts  string
			usage bool
		}{
			{``, false},
			{`,"stream_options":{}`, true},
			{`,"stream_options":{"continuous_usage_stats":false}`, true},
			{`,"stream_options":{"include_usage":false}`, false},
			{`,"stream_options":null`, false},
		} {
			events := streamEvents(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":2,"stream":true`+tc.opts+`}`)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("%s: no [DONE]: %q", tc.opts, events)
			}
			events = events[:len(events)-1]
			if tc.usage {
				last := decode(t, []byte(events[len(events)-1]))
				if u, ok := last["usage"].(map[string]any); !ok || len(last["choices"].([]any)) != 0 || u["prompt_tokens"] != 2.0 || u["completion_tokens"] != 2.0 {
					t.Fatalf("%s: last chunk %s, want the usage chunk", tc.opts, events[len(events)-1])
				}
				events = events[:len(events)-1]
			}
			for _, e := range events {
				m := decode(t, []byte(e))
				u, has := m["usage"]
				if has != usageNull || u != nil {
					t.Fatalf("usage-null %v, %s: chunk %s", usageNull, tc.opts, e)
				}
			}
		}
	}
}

// With prompt_logprobs, return_token_ids and kv_transfer_params, a chat
// answer puts prompt_logprobs, prompt_token_ids and kv_transfer_params after
// usage, as vLLM does, each growing with the prompt; a completion puts the
// first two in its choice, and kv_transfer_params after usage.
func TestNonStreamingTail(t *testing.T) {
	_, ts := newTestServer(t, "--max-model-len", "100000")
	prompt := strings.TrimSpace(strings.Repeat("word ", 2000))
	opts := `,"prompt_logprobs":0,"return_token_ids":true,"kv_transfer_params":{"do_remote_decode":true},"max_tokens":2}`
	chat := post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"`+prompt+`"}]`+opts, http.StatusOK)
	keys := topKeys(t, chat)
	want := []string{"id", "object", "created", "model", "choices", "usage", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params"}
	if strings.Join(keys, ",") != strings.Join(want, ",") {
		t.Fatalf("chat members %v, want %v", keys, want)
	}
	if tail := len(chat) - bytes.Index(chat, []byte(`"prompt_logprobs"`)); tail < 20*2000 {
		t.Fatalf("chat: %d bytes after usage for a 2000-token prompt", tail)
	}
	var resp struct {
		Choices []struct {
			TokenIDs []int `json:"token_ids"`
		}
		PromptLogprobs   []map[string]any `json:"prompt_logprobs"`
		PromptTokenIDs   []int            `json:"prompt_token_ids"`
		KVTransferParams struct {
			RemoteBlockIDs []int `json:"remote_block_ids"`
		} `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(chat, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.PromptLogprobs) != 2000 || resp.PromptLogprobs[0] != nil || len(resp.PromptLogprobs[1]) != 1 ||
		len(resp.PromptTokenIDs) != 2000 || len(resp.KVTransferParams.RemoteBlockIDs) != 125 || len(resp.Choices[0].TokenIDs) != 2 {
		t.Fatalf("chat tail: %d logprobs, %d prompt ids, %d blocks, %d token ids", len(resp.PromptLogprobs),
			len(resp.PromptTokenIDs), len(resp.KVTransferParams.RemoteBlockIDs), len(resp.Choices[0].TokenIDs))
	}

	cmpl := post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"`+prompt+`"`+opts, http.StatusOK)
	keys = topKeys(t, cmpl)
	if want := "id,object,created,model,choices,usage,kv_transfer_params"; strings.Join(keys, ",") != want {
		t.Fatalf("completion members %v, want %s", keys, want)
	}
	var c struct {
		Choices []struct {
			PromptLogprobs []any `json:"prompt_logprobs"`
			PromptTokenIDs []int `json:"prompt_token_ids"`
		}
	}
	if err := json.Unmarshal(cmpl, &c); err != nil || len(c.Choices[0].PromptLogprobs) != 2000 || len(c.Choices[0].PromptTokenIDs) != 2000 {
		t.Fatalf("completion choice: %v", err)
	}
}

// topKeys lists the members of a JSON object, in order.
func topKeys(t *testing.T, b []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %v", err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// With --enable-force-include-usage every chunk of a chat or completions
// stream carries usage and the stream ends with the usage chunk, whatever
// stream_options say; a plain answer is as before.
func TestForceIncludeUsage(t *testing.T) {
	_, ts := newTestServer(t, "--enable-force-include-usage")
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"a b"}]`},
		{"/v1/completions", `"prompt":"a b"`},
	} {
		for _, opts := range []string{``, `,"stream_options":{"include_usage":false}`, `,"stream_options":{}`} {
			events := streamEvents(t, ts.URL+tc.path, `{"model":"m1",`+tc.body+`,"max_tokens":2,"stream":true`+opts+`}`)
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("%s %s: events %q", tc.path, opts, events)
			}
			events = events[:len(events)-1]
			last := decode(t, []byte(events[len(events)-1]))
			if u, ok := last["usage"].(map[string]any); !ok || len(last["choices"].([]any)) != 0 || u["completion_tokens"] != 2.0 || u["total_tokens"] != 4.0 {
				t.Fatalf("%s %s: last chunk %s, want the usage chunk", tc.path, opts, events[len(events)-1])
			}
			made := 0.0
			for _, e := range events[:len(events)-1] {
				m := decode(t, []byte(e))
				u, ok := m["usage"].(map[string]any)
				if !ok || u["prompt_tokens"] != 2.0 || u["completion_tokens"].(float64) < made {
					t.Fatalf("%s %s: chunk without growing usage: %s", tc.path, opts, e)
				}
				made = u["completion_tokens"].(float64)
			}
			if made != 2 {
				t.Fatalf("%s %s: the last token chunk counts %v tokens", tc.path, opts, made)
			}
		}
	}
	plain := decode(t, post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":2}`, http.StatusOK))
	if u, ok := plain["usage"].(map[string]any); !ok || u["total_tokens"] != 4.0 {
		t.Fatalf("plain answer's usage: %v", plain["usage"])
	}
}
