package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newTestServer serves "/models/x" as m1 and m2 with a 100-token context.
func newTestServer(t *testing.T, extra ...string) (*Server, *httptest.Server) {
	t.Helper()
	cfg, err := ParseFlags(append([]string{"/models/x", "--served-model-name", "m1", "m2", "--max-model-len", "100", "--sim-tokens", "4"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	s := NewHandler(cfg, nil)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

// syncBuffer is a bytes.Buffer safe for concurrent use, for logs.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func do(t *testing.T, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	return doHeader(t, method, url, body, nil)
}

// doHeader is do with extra request headers.
func doHeader(t *testing.T, method, url, body string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return m
}

// normalize replaces the volatile id and created fields of a response.
func normalize(t *testing.T, m map[string]any, idPrefix string) {
	t.Helper()
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, idPrefix) || len(id) != len(idPrefix)+32 {
		t.Errorf("id %q: want %s + 32 hex digits", id, idPrefix)
	}
	if c, ok := m["created"].(float64); !ok || math.Abs(c-float64(time.Now().Unix())) > 60 {
		t.Errorf("created %v", m["created"])
	}
	m["id"], m["created"] = "ID", 0.0
}

func mustEqualJSON(t *testing.T, got map[string]any, want string) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) {
		g, _ := json.Marshal(got)
		t.Fatalf("got  %s\nwant %s", g, want)
	}
}

func TestModelsShape(t *testing.T) {
	_, ts := newTestServer(t)
	resp, b := do(t, "GET", ts.URL+"/v1/models", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	m := decode(t, b)
	for _, d := range m["data"].([]any) {
		card := d.(map[string]any)
		if _, ok := card["created"].(float64); !ok {
			t.Fatalf("created: %v", card["created"])
		}
		card["created"] = 0.0
		perm := card["permission"].([]any)[0].(map[string]any)
		if id, _ := perm["id"].(string); !strings.HasPrefix(id, "modelperm-") {
			t.Fatalf("permission id %q", id)
		}
		perm["id"], perm["created"] = "P", 0.0
	}
	perm := `[{"id":"P","object":"model_permission","created":0,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]`
	mustEqualJSON(t, m, `{"object":"list","data":[
		{"id":"m1","object":"model","created":0,"owned_by":"vllm","root":"/models/x","parent":null,"max_model_len":100,"permission":`+perm+`},
		{"id":"m2","object":"model","created":0,"owned_by":"vllm","root":"/models/x","parent":null,"max_model_len":100,"permission":`+perm+`}]}`)
}

func TestHealthAndPing(t *testing.T) {
	_, ts := newTestServer(t)
	for _, p := range []string{"/health", "/ping"} {
		resp, b := do(t, "GET", ts.URL+p, "")
		if resp.StatusCode != 200 || len(b) != 0 {
			t.Errorf("%s: %d %q", p, resp.StatusCode, b)
		}
	}
}

func TestChatNonStreaming(t *testing.T) {
	_, ts := newTestServer(t)
	resp, b := do(t, "POST", ts.URL+"/v1/chat/completions", `{"model":"m2","messages":[
		{"role":"system","content":"be  brief"},
		{"role":"user","content":[{"type":"text","text":"hello big\nworld"},{"type":"image_url","image_url":{"url":"x"}}]}],
		"max_tokens":3}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	m := decode(t, b)
	normalize(t, m, "chatcmpl-")
	// As vLLM does, the response names the first served model whatever alias was asked.
	mustEqualJSON(t, m, `{"id":"ID","object":"chat.completion","created":0,"model":"m1",
		"choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 ","reasoning_content":null,"tool_calls":[]},
		"logprobs":null,"finish_reason":"length","stop_reason":null}],
		"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3,"prompt_tokens_details":null},
		"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}`)
}

func TestCompletionNonStreaming(t *testing.T) {
	_, ts := newTestServer(t)
	_, b := do(t, "POST", ts.URL+"/v1/completions", `{"model":"m1","prompt":["one two","three"]}`)
	m := decode(t, b)
	normalize(t, m, "cmpl-")
	mustEqualJSON(t, m, `{"id":"ID","object":"text_completion","created":0,"model":"m1",
		"choices":[{"index":0,"text":"tok0 tok1 tok2 tok3 ","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null}],
		"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4,"prompt_tokens_details":null},
		"kv_transfer_params":null}`)
}

// readEvents returns the data payloads of an SSE body.
func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	expectBlank := false
	for sc.Scan() {
		line := sc.Text()
		if expectBlank {
			if line != "" {
				t.Fatalf("event not followed by a blank line: %q", line)
			}
			expectBlank = false
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		events = append(events, data)
		expectBlank = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

func TestStreamingUsageRules(t *testing.T) {
	_, ts := newTestServer(t)
	for _, chat := range []bool{true, false} {
		for _, opts := range []string{"", `,"stream_options":{"include_usage":true}`, `,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`} {
			path, body, object, idPrefix := "/v1/completions", `{"model":"m2","prompt":"a b c","max_tokens":3,"stream":true`+opts+`}`, "text_completion", "cmpl-"
			if chat {
				path, body, object, idPrefix = "/v1/chat/completions", `{"model":"m2","messages":[{"role":"user","content":"a b c"}],"max_tokens":3,"stream":true`+opts+`}`, "chat.completion.chunk", "chatcmpl-"
			}
			t.Run(path+opts, func(t *testing.T) {
				resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
					t.Fatalf("status %d type %q", resp.StatusCode, ct)
				}
				events := readEvents(t, resp.Body)
				if len(events) == 0 || events[len(events)-1] != "[DONE]" {
					t.Fatalf("stream does not end with [DONE]: %q", events)
				}
				events = events[:len(events)-1]
				includeUsage := strings.Contains(opts, "include_usage")
				continuous := strings.Contains(opts, "continuous")
				if includeUsage {
					last := decode(t, []byte(events[len(events)-1]))
					normalize(t, last, idPrefix)
					mustEqualJSON(t, last, `{"id":"ID","object":"`+object+`","created":0,"model":"m1","choices":[],
						"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`)
					events = events[:len(events)-1]
				}
				var id string
				var text strings.Builder
				for i, e := range events {
					m := decode(t, []byte(e))
					if id == "" {
						id = m["id"].(string)
					} else if m["id"] != id {
						t.Fatalf("chunk %d id %v != %v", i, m["id"], id)
					}
					if m["object"] != object || m["model"] != "m1" {
						t.Fatalf("chunk %d: %s", i, e)
					}
					usage, hasUsage := m["usage"]
					if hasUsage != continuous {
						t.Fatalf("chunk %d: usage present %v, want %v: %s", i, hasUsage, continuous, e)
					}
					choices := m["choices"].([]any)
					if len(choices) != 1 {
						t.Fatalf("chunk %d choices: %s", i, e)
					}
					c := choices[0].(map[string]any)
					generated := i
					if !chat {
						generated = i + 1
					}
					if continuous {
						u := usage.(map[string]any)
						if u["prompt_tokens"] != 3.0 || u["completion_tokens"] != float64(generated) || u["total_tokens"] != float64(3+generated) {
							t.Fatalf("chunk %d usage %v", i, u)
						}
					}
					wantFinish := any(nil)
					if i == len(events)-1 {
						wantFinish = "length"
					}
					if c["finish_reason"] != wantFinish || c["logprobs"] != nil || c["index"] != 0.0 {
						t.Fatalf("chunk %d: %s", i, e)
					}
					if chat {
						delta := c["delta"].(map[string]any)
						if i == 0 {
							if !reflect.DeepEqual(delta, map[string]any{"role": "assistant", "content": ""}) {
								t.Fatalf("first chunk delta %v", delta)
							}
							continue
						}
						text.WriteString(delta["content"].(string))
					} else {
						text.WriteString(c["text"].(string))
					}
				}
				if got := text.String(); got != "tok0 tok1 tok2 " {
					t.Fatalf("streamed text %q", got)
				}
			})
		}
	}
}

func TestErrorShapes(t *testing.T) {
	_, ts := newTestServer(t)
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string // exact JSON, or "" to check the type only
		typ                string
	}{
		{"POST", "/v1/chat/completions", `{"model":"nope","messages":[]}`, 404,
			"{\"error\":{\"message\":\"The model `nope` does not exist.\",\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}", ""},
		{"POST", "/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "", "NotFoundError"},
		{"POST", "/v1/chat/completions", `{"model":`, 400, "", "BadRequestError"},
		{"POST", "/v1/chat/completions", `{"model":"m1"}`, 400, "", "BadRequestError"},
		{"POST", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":5}]}`, 400, "", "BadRequestError"},
		{"POST", "/v1/completions", `{"model":"m1"}`, 400, "", "BadRequestError"},
		{"POST", "/v1/completions", `{"model":"m1","prompt":"x","max_tokens":"many"}`, 400, "", "BadRequestError"},
		{"POST", "/v1/completions", `{"model":"m1","prompt":"x","max_tokens":100}`, 400, "", "BadRequestError"},
		{"POST", "/v1/chat/completions", `{"model":"m1","messages":[],"stream_options":{"include_usage":true}}`, 400,
			"{\"error\":{\"message\":\"Stream options can only be defined when `stream=True`.\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}", ""},
		{"POST", "/v1/completions", `{"model":"m1","prompt":"x","stream":false,"stream_options":{"include_usage":true}}`, 400, "", "BadRequestError"},
	} {
		resp, b := do(t, tc.method, ts.URL+tc.path, tc.body)
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: status %d type %q: %s", tc.path, tc.body, resp.StatusCode, resp.Header.Get("Content-Type"), b)
			continue
		}
		if tc.want != "" {
			if string(b) != tc.want {
				t.Errorf("%s %s:\ngot  %s\nwant %s", tc.path, tc.body, b, tc.want)
			}
			continue
		}
		var e struct {
			Error struct {
				Message string
				Type    string
				Param   *string
				Code    int
			}
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Type != tc.typ || e.Error.Code != tc.status || e.Error.Message == "" {
			t.Errorf("%s %s: %s", tc.path, tc.body, b)
		}
	}
	if resp, b := do(t, "GET", ts.URL+"/v1/chat/completions", ""); resp.StatusCode != 405 {
		t.Errorf("GET chat: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, "GET", ts.URL+"/nope", ""); resp.StatusCode != 404 || string(b) != `{"detail":"Not Found"}` {
		t.Errorf("unknown path: %d %s", resp.StatusCode, b)
	}
}

func TestEmbeddings(t *testing.T) {
	_, ts := newTestServer(t, "--runner", "pooling")
	_, b := do(t, "POST", ts.URL+"/v1/embeddings", `{"model":"m2","input":["hello world","three more words"]}`)
	var floats struct {
		ID     string
		Object string
		Model  string
		Data   []struct {
			Index     int
			Object    string
			Embedding []float32
		}
		Usage map[string]any
	}
	if err := json.Unmarshal(b, &floats); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(floats.ID, "embd-") || floats.Object != "list" || floats.Model != "m1" || len(floats.Data) != 2 ||
		!reflect.DeepEqual(floats.Usage, map[string]any{"prompt_tokens": 5.0, "total_tokens": 5.0, "completion_tokens": 0.0, "prompt_tokens_details": nil}) {
		t.Fatalf("float response: %s", b)
	}
	for i, d := range floats.Data {
		if d.Index != i || d.Object != "embedding" || len(d.Embedding) != embeddingDim {
			t.Fatalf("data[%d]: %+v", i, d)
		}
	}
	_, b = do(t, "POST", ts.URL+"/v1/embeddings", `{"model":"m1","input":["hello world","three more words"],"encoding_format":"base64"}`)
	var b64 struct {
		Data []struct{ Embedding string }
	}
	if err := json.Unmarshal(b, &b64); err != nil || len(b64.Data) != 2 {
		t.Fatalf("base64 response %s: %v", b, err)
	}
	for i, d := range b64.Data {
		raw, err := base64.StdEncoding.DecodeString(d.Embedding)
		if err != nil || len(raw) != 4*embeddingDim {
			t.Fatalf("data[%d] %q: %v", i, d.Embedding, err)
		}
		for j := range embeddingDim {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); got != floats.Data[i].Embedding[j] {
				t.Fatalf("data[%d][%d]: base64 %v, float %v", i, j, got, floats.Data[i].Embedding[j])
			}
		}
	}
}

func TestMetrics(t *testing.T) {
	_, ts := newTestServer(t)
	do(t, "POST", ts.URL+"/v1/completions", `{"model":"m2","prompt":"a b c","max_tokens":2}`)
	do(t, "POST", ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":5,"stream":true}`)
	resp, b := do(t, "GET", ts.URL+"/metrics", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, want := range []string{
		series("vllm:num_requests_running") + " 0",
		series("vllm:num_requests_waiting") + " 0",
		series("vllm:kv_cache_usage_perc") + " 0",
		series("vllm:prompt_tokens_total") + " 5",
		series("vllm:generation_tokens_total") + " 7",
		series("vllm:time_to_first_token_seconds_count") + " 2",
		series("vllm:e2e_request_latency_seconds_count") + " 2",
		series("vllm:inter_token_latency_seconds_count") + " 5",
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, b)
		}
	}
}

// series is the name of a series of the test server's metrics, with its
// labels.
func series(name string) string { return name + `{engine="0",model_name="m1"}` }

// runningNow reads the running-requests count.
func (s *Server) runningNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStreamTimingAndDisconnect(t *testing.T) {
	s, ts := newTestServer(t, "--sim-ttft", "150ms", "--sim-itl", "20ms", "--max-model-len", "100000")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions",
		strings.NewReader(`{"model":"m1","prompt":"x","max_tokens":10000,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"text":"tok0 "`) {
		t.Fatalf("first line %q: %v", line, err)
	}
	if ttft := time.Since(start); ttft < 150*time.Millisecond {
		t.Fatalf("first token after %v, want at least the 150ms TTFT", ttft)
	}
	for range 2 {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.runningNow(); n != 1 {
		t.Fatalf("running %d, want 1", n)
	}
	cancel()
	waitFor(t, 2*time.Second, "the stream to stop after the client left", func() bool { return s.runningNow() == 0 })
}

func TestHang(t *testing.T) {
	_, ts := newTestServer(t, "--sim-hang")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("hung server answered %d", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
}

func TestCrashAfterTokensHook(t *testing.T) {
	cfg, err := ParseFlags([]string{"m", "--sim-crash-after-tokens", "5"})
	if err != nil {
		t.Fatal(err)
	}
	s := NewHandler(cfg, nil)
	var crashes atomic.Int32
	s.crash = func() { crashes.Add(1) }
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	// 3 tokens then [DONE]; then 2 more tokens and the "process" dies mid-stream.
	_, b := do(t, "POST", ts.URL+"/v1/completions", `{"model":"m","prompt":"x","max_tokens":3,"stream":true}`)
	if !strings.HasSuffix(string(b), "data: [DONE]\n\n") || crashes.Load() != 0 {
		t.Fatalf("first stream: %s (crashes %d)", b, crashes.Load())
	}
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","max_tokens":10,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("stream ended cleanly: %s", b)
	}
	if n := strings.Count(string(b), `"text":"tok`); n != 2 || strings.Contains(string(b), "[DONE]") || crashes.Load() != 1 {
		t.Fatalf("got %d tokens, crashes %d: %s", n, crashes.Load(), b)
	}
}

// A request without a model (or with an empty one) is served by the first
// served name, on every route, as vLLM's: the answer names it.
func TestModelOmittedIsFirstServedName(t *testing.T) {
	_, gen := newTestServer(t)
	_, pool := newTestServer(t, "--runner", "pooling")
	for _, tc := range []struct{ url, body string }{
		{gen.URL + "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`},
		{gen.URL + "/v1/completions", `{"model":"","prompt":"hi"}`},
		{gen.URL + "/v1/responses", `{"input":"hi"}`},
		{gen.URL + "/v1/messages", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
		{pool.URL + "/v1/embeddings", `{"input":"hi"}`},
	} {
		m := decode(t, post(t, tc.url, tc.body, http.StatusOK))
		if m["model"] != "m1" {
			t.Errorf("%s %s: model %v, want m1", tc.url, tc.body, m["model"])
		}
	}
}
