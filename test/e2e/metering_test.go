package e2e

// Metering of every route that generates tokens (docs/usage.md): the
// Responses and Anthropic Messages APIs, plain and streamed, on poold and
// fleetd, and answers whose usage cannot be read, recorded as estimates.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// apiCall is one request to the Responses or Messages API for model "m",
// bounded to 5 generated tokens.
type apiCall struct {
	name, path, body string
	stream           bool
}

func apiCalls(model string) []apiCall {
	responses := `{"model":%q,"input":"tell me a story","max_output_tokens":5%s}`
	messages := `{"model":%q,"max_tokens":5,"messages":[{"role":"user","content":"tell me a story"}]%s}`
	return []apiCall{
		{"responses", "/v1/responses", fmt.Sprintf(responses, model, ""), false},
		{"responses stream", "/v1/responses", fmt.Sprintf(responses, model, `,"stream":true`), true},
		{"messages", "/v1/messages", fmt.Sprintf(messages, model, ""), false},
		{"messages stream", "/v1/messages", fmt.Sprintf(messages, model, `,"stream":true`), true},
	}
}

// apiUsage is the engine's usage in a Responses or Messages answer, as a
// client reads it: the body's usage, or a stream's response.completed
// (response.usage) or message_delta (usage).
func apiUsage(t *testing.T, body []byte, stream bool) (input, output int) {
	t.Helper()
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	var ev struct {
		Type     string
		Usage    *usage
		Response struct{ Usage *usage }
	}
	if !stream {
		if err := json.Unmarshal(body, &ev); err != nil || ev.Usage == nil {
			t.Fatalf("no usage in %s (%v)", body, err)
		}
		return ev.Usage.InputTokens, ev.Usage.OutputTokens
	}
	for _, data := range sseEvents(body) {
		ev.Usage, ev.Response.Usage = nil, nil
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		switch {
		case ev.Type == "message_delta" && ev.Usage != nil:
			return ev.Usage.InputTokens, ev.Usage.OutputTokens
		case ev.Type == "response.completed" && ev.Response.Usage != nil:
			return ev.Response.Usage.InputTokens, ev.Response.Usage.OutputTokens
		}
	}
	t.Fatalf("no final usage in the stream %s", body)
	return 0, 0
}

// untilRefused sends calls in turn (at most max) until one is refused, and
// returns how many were answered and the refusal's status and body.
func untilRefused(t *testing.T, max int, calls []apiCall, send func(apiCall) (int, []byte)) (answered, code int, body []byte) {
	t.Helper()
	for i := range max {
		code, body = send(calls[i%len(calls)])
		if code != http.StatusOK {
			return i, code, body
		}
	}
	return max, http.StatusOK, nil
}

// Plain and streamed Responses and Messages answers are recorded on poold
// with the engine's exact counts, in the access log, the usage ledger and
// `poold usage`, and debited from the tenant's tokens per minute: a tenant
// at tpm 50 is refused once its answers' tokens reach it. A tenant's output
// cap bounds /v1/messages.
func TestResponsesAndMessagesMetered(t *testing.T) {
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	begin := time.Now()
	d := startPoold(t, tag, oneModel(tag, nil, "m"), "--state-dir", state, "--tenants", writeTenants(t, tenantsJSON(
		tenantSpec{Name: "team-a", Key: "sk-a", TPM: 1_000_000},
		tenantSpec{Name: "team-r", Key: "sk-r", TPM: 50},
		tenantSpec{Name: "team-m", Key: "sk-m", TPM: 50},
		tenantSpec{Name: "team-c", Key: "sk-c", MaxOutputTokens: 3},
	)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	engine := map[string][2]int{} // by request id: the engine's prompt and completion tokens
	var prompt, completion int
	for _, c := range apiCalls("m") {
		code, id, body := d.send(ctx, c.path, c.body, bearer("sk-a"))
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, code, body)
		}
		p, n := apiUsage(t, body, c.stream)
		if p == 0 || n != 5 {
			t.Errorf("%s: the engine reported %d prompt and %d completion tokens, want some and 5", c.name, p, n)
		}
		checkLogged(t, d, id, p, n)
		engine[id] = [2]int{p, n}
		prompt, completion = prompt+p, completion+n
	}

	// About 8 tokens an answer against 50 a minute: refused within ten.
	for _, tt := range []struct{ key, path string }{{"sk-r", "/v1/responses"}, {"sk-m", "/v1/messages"}} {
		var calls []apiCall
		for _, c := range apiCalls("m") {
			if c.path == tt.path {
				calls = append(calls, c)
			}
		}
		answered, code, body := untilRefused(t, 10, calls, func(c apiCall) (int, []byte) {
			code, _, body := d.send(ctx, c.path, c.body, bearer(tt.key))
			return code, body
		})
		if code != http.StatusTooManyRequests || answered == 0 {
			t.Fatalf("%s at tpm 50: %d answered, then %d %s; want a 429 within 10", tt.path, answered, code, body)
		}
		want := "tokens" // OpenAI's type: the limit's dimension
		if tt.path == "/v1/messages" {
			want = "rate_limit_error" // Anthropic's
		}
		if c, typ, _ := errorCode(t, body); c != "rate_limit_exceeded" || typ != want {
			t.Errorf("%s: the refusal is %s %s, want rate_limit_exceeded of type %s", tt.path, c, typ, want)
		}
	}

	// An output cap bounds /v1/messages' max_tokens, inserted when absent.
	capped := `{"model":"m","messages":[{"role":"user","content":"tell me a story"}]%s}`
	if code, _, body := d.send(ctx, "/v1/messages", fmt.Sprintf(capped, ""), bearer("sk-c")); code != http.StatusOK {
		t.Errorf("messages without max_tokens, capped at 3: %d %s", code, body)
	} else if _, n := apiUsage(t, body, false); n != 3 {
		t.Errorf("messages without max_tokens, capped at 3: %d tokens generated", n)
	}
	if code, _, body := d.send(ctx, "/v1/messages", fmt.Sprintf(capped, `,"max_tokens":50`), bearer("sk-c")); code != http.StatusBadRequest || !anthropicShaped(body) {
		t.Errorf("messages with max_tokens 50, capped at 3: %d %s; want a 400 in Anthropic's shape", code, body)
	}

	d.stop()
	end := time.Now()
	rows, _ := readLedger(t, filepath.Join(state, "usage.db"))
	found := 0
	for _, r := range rows {
		if want, ok := engine[r.ID]; ok {
			found++
			if r.Prompt != int64(want[0]) || r.Completion != int64(want[1]) || r.Estimated || r.Tenant != "team-a" {
				t.Errorf("ledger row %v, want %s's %d %d, not estimated", r, r.ID, want[0], want[1])
			}
		}
	}
	if found != len(engine) {
		t.Errorf("%d of the %d requests are in the ledger", found, len(engine))
	}
	rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	out, code := runPoold(t, "usage", "--state-dir", state, "--since", rfc(begin), "--until", rfc(end), "--by", "tenant", "--format", "json")
	var rep usageReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("poold usage --format json: exit %d, %v\n%s", code, err, out)
	}
	billed := false
	for _, r := range rep.Rows {
		if r.Key == "team-a" && r.Use == "serving" {
			billed = true
			if r.Requests != int64(len(engine)) || r.PromptTokens != int64(prompt) || r.CompletionTokens != int64(completion) {
				t.Errorf("poold usage bills team-a %d requests, %d and %d tokens; want %d, %d and %d", r.Requests, r.PromptTokens, r.CompletionTokens, len(engine), prompt, completion)
			}
		}
	}
	if !billed {
		t.Errorf("poold usage bills team-a nothing:\n%s", out)
	}
}

// waitFleetLine returns fleetd's access-log line of request id.
func (f *fleetd) waitFleetLine(id string) map[string]any {
	f.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for line := range strings.Lines(f.stdout.String()) {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "request" && rec["request_id"] == id {
				return rec
			}
		}
	}
	f.t.Fatalf("no access log line for request %s in:\n%s", id, f.stdout.String())
	return nil
}

// fleetTokens is the tokens of fleetd's access-log line: prompt, completion
// and whether they are estimated.
func fleetTokens(line map[string]any) string {
	return fmt.Sprint(line["prompt_tokens"], " ", line["completion_tokens"], " ", line["tokens_estimated"] == true)
}

// fleetd meters plain and streamed Responses and Messages answers as the
// engine reported them, and refuses a tenant at tpm 50 once they reach it.
func TestFleetMetersResponsesAndMessages(t *testing.T) {
	hosts := hostsWithA(t, 1, nil)
	f := startFleetd(t, hosts, "--tenants", writeTenants(t, tenantsJSON(team("team-a", 0, 1_000_000), team("team-t", 0, 50))))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	calls := apiCalls("a")
	for _, c := range calls {
		resp, body, err := f.send(ctx, c.path, "team-a", c.body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v %s", c.name, err, resp, body)
		}
		p, n := apiUsage(t, body, c.stream)
		if got, want := fleetTokens(f.waitFleetLine(resp.Header.Get("X-Request-Id"))), fmt.Sprint(p, " ", n, " false"); got != want {
			t.Errorf("%s: fleetd logged %s, want %s (the engine's)", c.name, got, want)
		}
	}
	answered, code, body := untilRefused(t, 10, calls, func(c apiCall) (int, []byte) {
		resp, body, err := f.send(ctx, c.path, "team-t", c.body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	})
	if code != http.StatusTooManyRequests || answered == 0 {
		t.Fatalf("team-t at tpm 50: %d answered, then %d %s; want a 429 within 10", answered, code, body)
	}
}

// An answer whose usage cannot be read (an engine that reports none) is
// recorded with an estimate, flagged, never as 0 tokens: on poold, the
// prompt from the body's size (one token per 4 bytes) and the completion
// from the stream's chunks of text (0 for a plain body); the same on
// fleetd.
func TestAnswersWithoutUsageAreEstimated(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "plain"}, {Name: "p1", GPUs: []int{1}, Default: "sse"}},
		[]sim{helperSim(tag, "plain", "plain"), helperSim(tag, "sse", "stream-no-usage")}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	f := startFleetd(t, []*daemon{d}, "--tenants", writeTenants(t, tenantsJSON(team("team-a", 0, 1_000_000))))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Bodies poold and fleetd forward as they are: the stream asks for
	// usage itself, so that neither adds stream_options.
	msgs := `"messages":[{"role":"user","content":"how many tokens is this prompt, would you say?"}]`
	for _, tt := range []struct {
		name, body string
		completion int
	}{
		{"plain", `{"model":"plain",` + msgs + `}`, 0},
		{"stream", `{"model":"sse","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`, 3},
	} {
		want := fmt.Sprint((len(tt.body)+3)/4, " ", tt.completion, " true")
		code, id, body := d.send(ctx, "/v1/chat/completions", tt.body, nil)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", tt.name, code, body)
		}
		line := waitLogLine(t, d, id)
		if got := fmt.Sprint(line["prompt_tokens"], " ", line["completion_tokens"], " ", line["tokens_estimated"]); got != want {
			t.Errorf("%s: poold logged %s, want %s", tt.name, got, want)
		}
		resp, body, err := f.send(ctx, "/v1/chat/completions", "team-a", tt.body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s through fleetd: %v %v %s", tt.name, err, resp, body)
		}
		if got := fleetTokens(f.waitFleetLine(resp.Header.Get("X-Request-Id"))); got != want {
			t.Errorf("%s: fleetd logged %s, want %s", tt.name, got, want)
		}
	}
}

// The pooling routes bill their prompt tokens, as the engine reported them
// (rerank's usage holds total_tokens alone, read as prompt tokens); the
// tokenizer routes, which run no model, bill nothing and estimate nothing.
func TestPoolingRoutesMetered(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "bge-m3"}}, []sim{{ID: "bge-m3"}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rerank := `{"model":"bge-m3","query":"a b","documents":["c d","e"]}`
	for _, tt := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"bge-m3","input":["a b c","d"]}`},
		{"/v1/score", `{"model":"bge-m3","text_1":"a b","text_2":"c d"}`},
		{"/rerank", rerank}, {"/v1/rerank", rerank},
		{"/classify", `{"model":"bge-m3","input":"a b c"}`},
		{"/pooling", `{"model":"bge-m3","input":"a b c"}`},
		{"/tokenize", `{"model":"bge-m3","prompt":"a b c"}`},
	} {
		code, id, body := d.send(ctx, tt.path, tt.body, nil)
		var u struct{ Usage map[string]int }
		if code != http.StatusOK || json.Unmarshal(body, &u) != nil {
			t.Fatalf("%s: %d %s", tt.path, code, body)
		}
		prompt := u.Usage["prompt_tokens"]
		if prompt == 0 {
			prompt = u.Usage["total_tokens"]
		}
		if tt.path != "/tokenize" && prompt == 0 {
			t.Fatalf("%s: no usage in %s", tt.path, body)
		}
		checkLogged(t, d, id, prompt, 0)
	}
}
