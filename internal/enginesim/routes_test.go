package enginesim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// --task is gone from vLLM: argparse rejects it with the value that follows.
func TestTaskFlagIsRejected(t *testing.T) {
	for _, args := range [][]string{
		{"/models/bge-m3", "--task", "embed"},
		{"/models/bge-m3", "--task=embed", "--port", "1"},
	} {
		_, err := ParseFlags(args)
		want := "unrecognized arguments: " + strings.Join(args[1:], " ")
		if args[1] == "--task=embed" {
			want = "unrecognized arguments: --task=embed"
		}
		if err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--runner", "embed"}, "argument --runner: invalid choice: 'embed' (choose from 'auto', 'generate', 'pooling', 'draft')"},
		{[]string{"--convert", "score"}, "argument --convert: invalid choice: 'score' (choose from 'auto', 'none', 'embed', 'classify', 'reward')"},
	} {
		if _, err := ParseFlags(tc.args); err == nil || err.Error() != tc.want {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestModelKind(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want modelKind
	}{
		{[]string{"/models/Qwen2.5-7B-Instruct"}, generative},
		{[]string{"/models/bge-m3"}, pooling},
		{[]string{"BAAI/bge-reranker-v2-m3"}, pooling},
		{[]string{"intfloat/multilingual-e5-large"}, pooling},
		{[]string{"Alibaba-NLP/gte-Qwen2-7B-instruct"}, pooling},
		{[]string{"nomic-ai/nomic-embed-text-v1.5"}, pooling},
		{[]string{"/models/Qwen2.5-7B-Instruct", "--runner", "pooling"}, pooling},
		{[]string{"/models/Qwen2.5-7B-Instruct", "--convert", "embed"}, pooling},
		{[]string{"/models/bge-m3", "--runner", "generate"}, generative},
		{[]string{"openai/whisper-large-v3"}, transcription},
		{[]string{"/models/e5mistral"}, generative}, // "e5" only as a word
	} {
		cfg, err := ParseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.kind(); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.args, got, tc.want)
		}
	}
}

// Each kind of model serves its own routes and answers 404 for the others,
// as vLLM registers routes by the model's tasks; all serve /tokenize and
// /detokenize.
func TestRoutesByKind(t *testing.T) {
	routes := map[string][]string{
		"generate":      {"/v1/chat/completions", "/v1/completions"},
		"pooling":       {"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank"},
		"transcription": {"/v1/audio/transcriptions", "/v1/audio/translations"},
	}
	for kind, start := range map[string]func() *httptest.Server{
		"generate":      func() *httptest.Server { _, ts := newTestServer(t); return ts },
		"pooling":       func() *httptest.Server { _, ts := newTestServer(t, "--runner", "pooling"); return ts },
		"transcription": func() *httptest.Server { return newWhisperServer(t) },
	} {
		ts := start()
		for k, paths := range routes {
			for _, p := range paths {
				resp, b := do(t, http.MethodPost, ts.URL+p, `{}`)
				served := resp.StatusCode != http.StatusNotFound || string(b) != `{"detail":"Not Found"}`
				if served != (k == kind) {
					t.Errorf("%s model, POST %s: %d %s", kind, p, resp.StatusCode, b)
				}
			}
		}
		b := post(t, ts.URL+"/tokenize", `{"model":"m1","prompt":"one two three"}`, http.StatusOK)
		m := decode(t, b)
		ids, _ := m["tokens"].([]any)
		if m["count"] != 3.0 || len(ids) != 3 || m["max_model_len"] != 100.0 {
			t.Errorf("%s model, /tokenize: %s", kind, b)
		}
		b = post(t, ts.URL+"/detokenize", `{"model":"m1","tokens":[7,9]}`, http.StatusOK)
		if string(b) != `{"prompt":"w7 w9"}` {
			t.Errorf("%s model, /detokenize: %s", kind, b)
		}
	}
}

func TestTokenizeChat(t *testing.T) {
	_, ts := newTestServer(t)
	b := post(t, ts.URL+"/tokenize", `{"messages":[{"role":"user","content":"a b"},{"role":"user","content":"c"}],"return_token_strs":true}`, http.StatusOK)
	m := decode(t, b)
	if m["count"] != 3.0 || len(m["token_strs"].([]any)) != 3 {
		t.Fatalf("/tokenize of messages: %s", b)
	}
	post(t, ts.URL+"/tokenize", `{"model":"nope","prompt":"x"}`, http.StatusNotFound)
	post(t, ts.URL+"/tokenize", `{"model":"m1"}`, http.StatusBadRequest)
}

func TestPoolingEndpoints(t *testing.T) {
	_, ts := newTestServer(t, "--runner", "pooling")

	m := decode(t, post(t, ts.URL+"/score", `{"model":"m1","text_1":"what is x","text_2":["x is y","z"]}`, http.StatusOK))
	data := m["data"].([]any)
	if !strings.HasPrefix(m["id"].(string), "score-") || m["object"] != "list" || len(data) != 2 ||
		data[1].(map[string]any)["object"] != "score" || m["usage"].(map[string]any)["prompt_tokens"] != 10.0 {
		t.Errorf("/score: %v", m)
	}
	for _, d := range data {
		if sc := d.(map[string]any)["score"].(float64); sc < 0 || sc >= 1 {
			t.Errorf("/score: score %v", sc)
		}
	}
	post(t, ts.URL+"/v1/score", `{"model":"m1","text_1":["a","b"],"text_2":["a","b","c"]}`, http.StatusBadRequest)

	m = decode(t, post(t, ts.URL+"/v1/rerank", `{"model":"m1","query":"q","documents":["a","b c","d"],"top_n":2}`, http.StatusOK))
	results := m["results"].([]any)
	if !strings.HasPrefix(m["id"].(string), "rerank-") || len(results) != 2 || m["usage"].(map[string]any)["total_tokens"] != 5.0 {
		t.Fatalf("/v1/rerank: %v", m)
	}
	first, second := results[0].(map[string]any), results[1].(map[string]any)
	if first["relevance_score"].(float64) < second["relevance_score"].(float64) || first["document"].(map[string]any)["text"] == nil {
		t.Errorf("/v1/rerank results not by relevance: %v", results)
	}

	m = decode(t, post(t, ts.URL+"/classify", `{"model":"m1","input":["a","b"]}`, http.StatusOK))
	c := m["data"].([]any)[1].(map[string]any)
	probs := c["probs"].([]any)
	if !strings.HasPrefix(m["id"].(string), "classify-") || c["index"] != 1.0 || c["num_classes"] != 2.0 || len(probs) != 2 ||
		probs[0].(float64)+probs[1].(float64) != 1 {
		t.Errorf("/classify: %v", m)
	}

	m = decode(t, post(t, ts.URL+"/pooling", `{"model":"m1","input":"a b"}`, http.StatusOK))
	d := m["data"].([]any)[0].(map[string]any)
	if !strings.HasPrefix(m["id"].(string), "pool-") || d["object"] != "pooling" || len(d["data"].([]any)) != embeddingDim {
		t.Errorf("/pooling: %v", m)
	}

	for _, tc := range []struct {
		path, body string
		status     int
	}{
		{"/v1/embeddings", `{"model":"nope","input":"x"}`, http.StatusNotFound},
		{"/v1/embeddings", `{"model":"m1"}`, http.StatusBadRequest},
		{"/v1/embeddings", `{"model":"m1","input":"x","encoding_format":"hex"}`, http.StatusBadRequest},
		{"/rerank", `{"model":"m1","query":"q"}`, http.StatusBadRequest},
		{"/classify", `{"model":"m1","input":{}}`, http.StatusBadRequest},
	} {
		resp, b := do(t, http.MethodPost, ts.URL+tc.path, tc.body)
		if resp.StatusCode != tc.status || !strings.Contains(string(b), `"error"`) {
			t.Errorf("%s %s: %d %s, want %d", tc.path, tc.body, resp.StatusCode, b, tc.status)
		}
	}
}

// Every JSON route answers 400 in vLLM's error shape unless the request's
// Content-Type is application/json, in any letter case and with any
// parameters (vLLM's validate_json_request); the audio routes take a form.
// A path the model does not serve is a 404 and a GET a 405 first.
func TestJSONRoutesNeedJSONContentType(t *testing.T) {
	_, gen := newTestServer(t)
	_, pooling := newTestServer(t, "--runner", "pooling")
	whisper := newWhisperServer(t)
	for ts, paths := range map[*httptest.Server][]string{
		gen:     {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize", "/detokenize"},
		pooling: {"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank"},
		whisper: {"/tokenize", "/detokenize"},
	} {
		for _, p := range paths {
			for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/jsonl", "application/json ; charset=utf-8"} {
				resp, b := doHeader(t, http.MethodPost, ts.URL+p, `{"model":"m1"}`, map[string]string{"Content-Type": ct})
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("POST %s as %q: %d %s, want 400", p, ct, resp.StatusCode, b)
					continue
				}
				mustEqualJSON(t, decode(t, b), `{"error":{"message":"1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed","type":"Bad Request","param":null,"code":400}}`)
			}
			for _, ct := range []string{"application/json", "Application/JSON; charset=utf-8", "application/json;charset=UTF-8"} {
				resp, b := doHeader(t, http.MethodPost, ts.URL+p, `{"model":"m1"}`, map[string]string{"Content-Type": ct})
				if bytes.Contains(b, []byte("Unsupported Media Type")) {
					t.Errorf("POST %s as %q refused: %d %s", p, ct, resp.StatusCode, b)
				}
			}
		}
	}
	for _, tt := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/v1/embeddings", http.StatusNotFound},
		{http.MethodGet, "/v1/chat/completions", http.StatusMethodNotAllowed},
	} {
		if resp, b := doHeader(t, tt.method, gen.URL+tt.path, "", map[string]string{"Content-Type": ""}); resp.StatusCode != tt.want {
			t.Errorf("%s %s without a Content-Type: %d %s, want %d", tt.method, tt.path, resp.StatusCode, b, tt.want)
		}
	}
	resp, b := postForm(t, whisper.URL+"/v1/audio/transcriptions", map[string]string{"model": "m1"}, 10)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a form to the transcription route: %d %s", resp.StatusCode, b)
	}
}
