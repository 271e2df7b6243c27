package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// waitAccessLine waits until the access log at path has the line of request
// id, and returns it.
func waitAccessLine(t *testing.T, path, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if raw, _ := os.ReadFile(path); bytes.Contains(raw, []byte(`"request_id":"`+id+`"`)) {
			return accessLines(t, path)[id]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access-log line for request %s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An engine that dies mid-stream: the request is recorded as
// upstream_aborted (not as a plain 2xx), in the access log and in
// poold_requests_total, with the tokens the client received as an estimate.
func TestEngineCutIsUpstreamAborted(t *testing.T) {
	tag := t.Name()
	accessPath := filepath.Join(t.TempDir(), "access.log")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "fragile"}},
		[]sim{{ID: "fragile", Flags: []string{"--sim-crash-after-tokens", "5", "--sim-itl", "5ms"}}}, nil),
		"--access-log", accessPath)
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	// The connection may be aborted after poold's error event: err is not
	// checked.
	code, hdr, body, _ := d.post(context.Background(), "/v1/chat/completions", chatBody("fragile", true, 20))
	id := hdr.Get("X-Request-Id")
	if code != http.StatusOK || bytes.Contains(body, []byte("[DONE]")) {
		t.Fatalf("the cut stream: %d %s", code, body)
	}
	l := waitAccessLine(t, accessPath, id)
	if l["outcome"] != "upstream_aborted" || l["tokens_estimated"] != true || l["completion_tokens"].(float64) < 1 || l["completion_tokens"].(float64) > 5 {
		t.Fatalf("access log of the cut stream: %v; want upstream_aborted with 1 to 5 estimated tokens", l)
	}
	t.Logf("cut stream: %v estimated completion tokens", l["completion_tokens"])
	if v := d.metricValue(`poold_requests_total{client="none",code_class="2xx",outcome="upstream_aborted",pool="p0",profile="fragile",stream="true"}`); v != 1 {
		t.Fatalf(`poold_requests_total{outcome="upstream_aborted"} = %v, want 1`, v)
	}
}

// An engine that promises a Content-Length and closes early: the client's
// answer is cut, and poold records upstream_aborted, not a plain 2xx.
func TestShortBodyIsUpstreamAborted(t *testing.T) {
	tag := t.Name()
	accessPath := filepath.Join(t.TempDir(), "access.log")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-cut-body"}}}, nil),
		"--access-log", accessPath)
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	// The answer may be cut before its headers reach the client: the request
	// carries its own id.
	const id = "short-body-1"
	req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", false, 5)))
	req.Header.Set("X-Request-Id", id)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && bytes.Contains(body, []byte(`"usage"`)) {
			t.Fatalf("a whole answer from an engine that cuts its bodies: %s", body)
		}
	}
	l := waitAccessLine(t, accessPath, id)
	if l["outcome"] != "upstream_aborted" {
		t.Fatalf("access log of the cut answer: %v", l)
	}
	if v := d.metricValue(`poold_requests_total{client="none",code_class="2xx",outcome="upstream_aborted",pool="p0",profile="m",stream="false"}`); v != 1 {
		t.Fatalf(`poold_requests_total{outcome="upstream_aborted"} = %v, want 1`, v)
	}
}

// SSE lines may end with a lone CR: poold passes such a stream through event
// by event, withholds the usage chunk it asked for, and counts the tokens.
func TestCROnlyStream(t *testing.T) {
	tag := t.Name()
	accessPath := filepath.Join(t.TempDir(), "access.log")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-sse-newline", "cr"}}}, nil),
		"--access-log", accessPath)
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("m", true, 6))
	if err != nil || code != http.StatusOK {
		t.Fatalf("%d %v %s", code, err, body)
	}
	if bytes.Contains(body, []byte(`"usage":{`)) {
		t.Fatalf("the usage chunk poold asked for reached a client that did not ask: %q", body)
	}
	if !bytes.Contains(body, []byte("data: [DONE]\r")) {
		t.Fatalf("the CR-terminated stream was not passed through: %q", body)
	}
	l := waitAccessLine(t, accessPath, hdr.Get("X-Request-Id"))
	if l["completion_tokens"] != 6.0 || l["tokens_estimated"] != false || l["outcome"] != "completed" {
		t.Fatalf("access log of the CR-only stream: %v", l)
	}
}
