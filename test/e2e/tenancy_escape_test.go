package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// escape is one way a tenant tried to get around its output cap, as a
// hostile tenant's attack found them: the body, and what must come of it.
type escape struct {
	what, path, body string
	// param is the key the 400 names; "" when the request is served, and
	// then at most maxCompletion tokens may come back.
	param         string
	maxCompletion int
}

// capEscapes are the attack's examples against a cap of 50 output tokens,
// with an engine that answers 300 tokens when nothing bounds it: an
// explicit null, case variants and duplicates of the keys poold acts on,
// and n multiplying the cap.
var capEscapes = []escape{
	{"max_completion_tokens null", "/v1/chat/completions", `{"model":"m","max_completion_tokens":null,"messages":[{"role":"user","content":"hi"}]}`, "", 50},
	{"max_tokens null", "/v1/completions", `{"model":"m","max_tokens":null,"prompt":"hi"}`, "", 50},
	{"both bounds, one null", "/v1/chat/completions", `{"model":"m","max_tokens":10,"max_completion_tokens":null,"messages":[{"role":"user","content":"hi"}]}`, "", 10},
	{"a case variant above the cap", "/v1/chat/completions", `{"model":"m","Max_Completion_Tokens":1000,"messages":[{"role":"user","content":"hi"}]}`, "Max_Completion_Tokens", 0},
	{"a case variant beside the bound", "/v1/completions", `{"model":"m","max_tokens":5,"MAX_TOKENS":1000,"prompt":"hi"}`, "MAX_TOKENS", 0},
	{"a duplicate bound", "/v1/completions", `{"model":"m","max_tokens":5,"max_tokens":1000,"prompt":"hi"}`, "max_tokens", 0},
	{"Stream_Options after stream_options", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"Stream_Options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`, "Stream_Options", 0},
	{"STREAM beside stream", "/v1/chat/completions", `{"model":"m","stream":false,"STREAM":true,"messages":[{"role":"user","content":"hi"}]}`, "STREAM", 0},
	{"Include_Usage inside stream_options", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`, "Include_Usage", 0},
	{"a duplicate n", "/v1/chat/completions", `{"model":"m","n":1,"n":3,"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`, "n", 0},
	{"n times the cap", "/v1/chat/completions", `{"model":"m","n":3000,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, "n", 0},
	{"n times a bound under the cap", "/v1/chat/completions", `{"model":"m","n":3,"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", 0},
	{"n without a bound", "/v1/chat/completions", `{"model":"m","n":4,"messages":[{"role":"user","content":"hi"}]}`, "", 50},
	{"best_of without a bound", "/v1/completions", `{"model":"m","n":1,"best_of":2,"prompt":"hi"}`, "", 50},
	{"max_output_tokens null", "/v1/responses", `{"model":"m","max_output_tokens":null,"input":"hi"}`, "", 50},
	{"a case variant on responses", "/v1/responses", `{"model":"m","Max_Output_Tokens":1000,"input":"hi"}`, "Max_Output_Tokens", 0},
	{"max_tokens null on messages", "/v1/messages", `{"model":"m","max_tokens":null,"max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", 0},
	{"messages above the cap", "/v1/messages", `{"model":"m","max_tokens":51,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", 0},
}

// checkEscapes sends each of capEscapes with post, which returns the
// answer's status and body, and checks that none gets past the cap.
func checkEscapes(t *testing.T, post func(path, body string) (int, []byte)) {
	t.Helper()
	for _, e := range capEscapes {
		code, body := post(e.path, e.body)
		if e.param != "" {
			var ae apiErr
			if code == http.StatusBadRequest {
				ae = apiError(t, body)
			}
			named := ae.Error.Param != nil && *ae.Error.Param == e.param
			if e.path == "/v1/messages" {
				// Anthropic's shape: no param, the message names the key.
				named = anthropicShaped(body) && ae.Error.Type == "invalid_request_error"
			}
			if code != http.StatusBadRequest || !named || !strings.Contains(ae.Error.Message, e.param) {
				t.Errorf("%s: %d %.200s; want a 400 naming %s", e.what, code, body, e.param)
			}
			continue
		}
		if code != http.StatusOK {
			t.Errorf("%s: %d %.200s", e.what, code, body)
			continue
		}
		var u struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
				OutputTokens     int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &u); err != nil {
			t.Fatalf("%s: %v: %.200s", e.what, err, body)
		}
		if completion := u.Usage.CompletionTokens + u.Usage.OutputTokens; completion > e.maxCompletion || completion == 0 {
			t.Errorf("%s: %d completion tokens under a cap of 50; want 1 to %d", e.what, completion, e.maxCompletion)
		}
	}
}

// A tenant cannot get around its output cap on poold: every example of the
// attack is refused with a 400 naming the key, or served within the cap.
func TestTenantCapCannotBeEscaped(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-tokens", "300"}}}, nil),
		"--tenants", writeTenants(t, tenantsJSON(tenantSpec{Name: "team-a", Key: "sk-a", MaxOutputTokens: 50})))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	checkEscapes(t, func(path, body string) (int, []byte) {
		code, _, b := sendTo(t.Context(), t, d.url+path, body, bearer("sk-a"))
		return code, b
	})
}

// The same on fleetd, which applies the cap before any host is asked.
func TestFleetTenantCapCannotBeEscaped(t *testing.T) {
	tag := t.Name()
	h := startPoold(t, tag, hostProfiles(tag, "m", []string{"m"}, "--sim-tokens", "300", "--sim-itl", "1ms"))
	h.waitPool("gpu0", 20*time.Second, "m ready", func(p poolView) bool { return p.State == "ready" })
	a := team("team-a", 0, 0)
	a.MaxOutputTokens = 50
	f := startFleetd(t, []*daemon{h}, "--tenants", writeTenants(t, tenantsJSON(a)))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkEscapes(t, func(path, body string) (int, []byte) {
		resp, b, err := f.send(ctx, path, "team-a", body)
		if err != nil {
			t.Fatal(fmt.Errorf("fleetd: %w", err))
		}
		return resp.StatusCode, b
	})
}
