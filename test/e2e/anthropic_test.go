package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sdkDir holds the Anthropic TypeScript SDK, pinned in its package-lock.json
// (`npm ci` there installs it; scripts/tools-check.sh does), and client.mjs,
// which calls it.
const sdkDir = "anthropic-sdk"

// anthropicShaped reports whether body is an error in Anthropic's shape,
// {"type": "error", "error": {"type", "message"}}.
func anthropicShaped(body []byte) bool {
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	return json.Unmarshal(body, &e) == nil && e.Type == "error" && e.Error.Type != "" && e.Error.Message != ""
}

// sdkError is what client.mjs reports of an error the SDK raised (a null
// member is left zero).
type sdkError struct {
	Class, Type, Message, Code, RetryAfter string
	Status                                 int
}

// sdkResult is client.mjs's report of one step.
type sdkResult struct {
	Text, Final, StopReason string
	Usage                   struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	Error *sdkError
}

// anthropicSDK returns a function that runs one step of client.mjs against
// baseURL with an API key and model, or nil after skipping the test where
// node or the installed SDK is missing (a failure with REQUIRE_TOOLS=1, as
// in CI).
func anthropicSDK(t *testing.T) func(ctx context.Context, step, baseURL, key, model string) sdkResult {
	t.Helper()
	node, err := exec.LookPath("node")
	if _, serr := os.Stat(filepath.Join(sdkDir, "node_modules", "@anthropic-ai", "sdk", "package.json")); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		if os.Getenv("REQUIRE_TOOLS") == "1" {
			t.Fatalf("node and the Anthropic SDK are required (REQUIRE_TOOLS=1): %v; run npm ci in test/e2e/%s", err, sdkDir)
		}
		t.Skipf("node or the Anthropic SDK is missing (%v): run npm ci in test/e2e/%s, or set REQUIRE_TOOLS=1 to require it", err, sdkDir)
		return nil
	}
	return func(ctx context.Context, step, baseURL, key, model string) sdkResult {
		t.Helper()
		cmd := exec.CommandContext(ctx, node, "client.mjs", step, baseURL, key, model)
		cmd.Dir = sdkDir
		out, err := cmd.Output()
		var r sdkResult
		if err != nil || json.Unmarshal(out, &r) != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("client.mjs %s: %v\n%s%s", step, err, out, stderr)
		}
		return r
	}
}

// The Anthropic TypeScript SDK works against poold's Messages route: a
// message, a streamed one read with its stream helper (text events, final
// usage), and poold's own refusals raised as the SDK's typed errors with
// poold's message and code: an unknown model (NotFoundError), a tenant past
// its rate limit (RateLimitError, with Retry-After), and a stream whose
// wait for its model timed out after keep-alive comments had committed it
// (Anthropic's error event, raised as an overloaded_error).
func TestAnthropicSDK(t *testing.T) {
	sdk := anthropicSDK(t)
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}, {Name: "p1", GPUs: []int{1}}},
		[]sim{{ID: "m", Pools: []string{"p0"}},
			{ID: "slow", Pools: []string{"p1"}, Flags: []string{"--sim-load-delay", "30s"}, Extra: map[string]any{"maxQueueWait": "1s"}}}, nil),
		"--keepalive-interval", "200ms",
		"--tenants", writeTenants(t, tenantsJSON(
			tenantSpec{Name: "team-a", Key: "sk-a"},
			tenantSpec{Name: "team-r", Key: "sk-r", RPM: 1},
		)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const want = "tok0 tok1 tok2 tok3 tok4 "

	if r := sdk(ctx, "create", d.url, "sk-a", "m"); r.Text != want || r.StopReason != "max_tokens" || r.Usage.InputTokens == 0 || r.Usage.OutputTokens != 5 {
		t.Errorf("messages.create: %+v", r)
	}
	if r := sdk(ctx, "stream", d.url, "sk-a", "m"); r.Text != want || r.Final != want || r.Usage.InputTokens == 0 || r.Usage.OutputTokens != 5 {
		t.Errorf("messages.stream: %+v", r)
	}

	r := sdk(ctx, "create-error", d.url, "sk-a", "nope")
	if e := r.Error; e == nil || e.Class != "NotFoundError" || e.Status != 404 || e.Type != "not_found_error" || e.Code != "model_not_found" ||
		!strings.HasPrefix(e.Message, `model "nope" does not exist; available models: `) {
		t.Errorf("an unknown model: %+v", r.Error)
	}

	if r := sdk(ctx, "create", d.url, "sk-r", "m"); r.Text != want {
		t.Errorf("the rpm-1 tenant's first message: %+v", r)
	}
	r = sdk(ctx, "create-error", d.url, "sk-r", "m")
	if e := r.Error; e == nil || e.Class != "RateLimitError" || e.Status != 429 || e.Type != "rate_limit_error" || e.Code != "rate_limit_exceeded" ||
		e.RetryAfter == "" || !strings.Contains(e.Message, `rate limit reached for tenant "team-r"`) {
		t.Errorf("past rpm 1: %+v", r.Error)
	}

	r = sdk(ctx, "stream-error", d.url, "sk-a", "slow")
	if e := r.Error; e == nil || e.Class != "APIError" || e.Type != "overloaded_error" || e.Code != "queue_timeout" ||
		!strings.Contains(e.Message, "timed out waiting for the model to load") || !strings.Contains(e.Message, "retry after") || r.Text != "" {
		t.Errorf("a stream whose wait timed out after keep-alives: %+v (text %q)", r.Error, r.Text)
	}
}
