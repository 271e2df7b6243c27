package fleet

import (
	"encoding/json"
	"net/http"
	"testing"
)

// The affinity key walks the body instead of decoding it, and must give the
// key decoding gives: the first message's content, else the prompt, else the
// input, raw, cut to AffinityBytes.
func TestAffinityKeyMatchesDecoding(t *testing.T) {
	decoded := func(body string, n int) string {
		var b struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
			Prompt json.RawMessage `json:"prompt"`
			Input  json.RawMessage `json:"input"`
		}
		_ = json.Unmarshal([]byte(body), &b)
		p := b.Input
		switch {
		case len(b.Messages) > 0:
			p = b.Messages[0].Content
		case len(b.Prompt) > 0:
			p = b.Prompt
		}
		return "prefix:" + string(p[:min(len(p), n)])
	}
	bodies := []string{
		`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}`,
		` { "model" : "m" , "messages" : [ { "content" : [ {"type":"text","text":"a\"b"} ] , "role":"user"} ] } `,
		`{"messages":[{"role":"user"}],"prompt":"p","model":"m"}`,
		`{"model":"m","messages":[],"prompt":"once upon a time"}`,
		`{"model":"m","messages":null,"prompt":[1,2,3]}`,
		`{"model":"m","prompt":null,"input":"x"}`,
		`{"model":"m","input":["a","b"]}`,
		`{"model":"m","input":"first","input":"second"}`,
		`{"model":"m","messages":"not an array","input":"x"}`,
		`{"model":"m","messages":["not an object"]}`,
		`{"model":"m","messages":[{"content":"{\"x\":[1,{\"y\":\"]\"}]}"}]}`,
		`{"model":"m","mess\u0061ges":[{"content":"escaped key"}]}`,
		`{"model":"m","max_tokens":16,"messages":[{"content":12.5e3}]}`,
		`{"model":"m"}`,
	}
	h := NewHandler(New(Options{}), HandlerOptions{AffinityBytes: 10})
	for _, body := range bodies {
		for _, n := range []int{10, 512} {
			h.opts.AffinityBytes = n
			if got, want := h.affinityKey(&http.Request{Header: http.Header{}}, []byte(body)), decoded(body, n); got != want {
				t.Errorf("body %s, %d bytes: key %q, want %q (as decoded)", body, n, got, want)
			}
		}
	}
}
