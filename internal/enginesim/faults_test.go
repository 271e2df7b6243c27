package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// --sim-hang-requests: the engine looks ready (/v1/models answers) but never
// answers a POST.
func TestHangRequests(t *testing.T) {
	_, ts := newTestServer(t, "--sim-hang-requests")
	if resp, _ := do(t, "GET", ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/models: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"model":"m1","prompt":"x"}`))
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("hung server answered %d", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
}

// --sim-log-headers logs header names, never their values.
func TestLogHeaders(t *testing.T) {
	cfg, err := ParseFlags([]string{"m", "--sim-log-headers"})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	ts := httptest.NewServer(NewHandler(cfg, slog.New(slog.NewTextHandler(&logs, nil))))
	t.Cleanup(ts.Close)
	req, _ := http.NewRequest("GET", ts.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-secret")
	req.Header.Set("X-Custom", "v")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	out := logs.String()
	if !strings.Contains(out, "Authorization") || !strings.Contains(out, "X-Custom") || strings.Contains(out, "sk-secret") {
		t.Fatalf("header log: %s", out)
	}
}

// --sim-sse-newline ends SSE lines with CR or CRLF, both valid per the SSE
// specification.
func TestSSENewline(t *testing.T) {
	for nl, end := range map[string]string{"cr": "\r\r", "crlf": "\r\n\r\n", "lf": "\n\n"} {
		_, ts := newTestServer(t, "--sim-sse-newline", nl)
		b := string(post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":2,"stream":true,"stream_options":{}}`, http.StatusOK))
		events := strings.Split(strings.TrimSuffix(b, end), end)
		if len(events) != 4 || events[3] != "data: [DONE]" || (nl == "cr" && strings.Contains(b, "\n")) {
			t.Errorf("%s: %q", nl, b)
		}
		for _, e := range events[:3] {
			if !strings.HasPrefix(e, "data: {") || strings.ContainsAny(e, "\r\n") {
				t.Errorf("%s: event %q", nl, e)
			}
		}
	}
}

// --sim-cut-body promises a Content-Length and closes the connection
// halfway through the body.
func TestCutBody(t *testing.T) {
	_, ts := newTestServer(t, "--sim-cut-body")
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m1","prompt":"x","max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 || !errors.Is(err, io.ErrUnexpectedEOF) || int64(len(b)) != resp.ContentLength/2 {
		t.Fatalf("%d, Content-Length %d, read %d bytes, %v", resp.StatusCode, resp.ContentLength, len(b), err)
	}
	// Streams, and answers that are not inference results, are whole.
	if resp, b := do(t, "GET", ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK || !json.Valid(b) {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, b)
	}
	post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"x","max_tokens":3,"stream":true}`, http.StatusOK)
}

// --sim-clean-paths cleans dot-segments from the decoded path before
// routing, as permissive engines do: "/v1/%2e%2e/sleep" reaches /sleep.
// Without it, such a path is a 404.
func TestCleanPaths(t *testing.T) {
	for _, clean := range []bool{false, true} {
		var extra []string
		if clean {
			extra = []string{"--sim-clean-paths"}
		}
		_, ts := newSleepServer(t, true, extra...)
		resp, b := do(t, http.MethodPost, ts.URL+"/v1/%2e%2e/sleep?level=1", "")
		if (resp.StatusCode == http.StatusOK) != clean || isSleeping(t, ts.URL) != clean {
			t.Errorf("clean %v: %d %s, asleep %v", clean, resp.StatusCode, b, isSleeping(t, ts.URL))
		}
	}
}

// --sim-fail-requests: the engine looks ready but answers every POST with 500.
func TestFailRequests(t *testing.T) {
	_, ts := newTestServer(t, "--sim-fail-requests")
	if resp, _ := do(t, "GET", ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/models: %d", resp.StatusCode)
	}
	resp, body := do(t, "POST", ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "simulated failure") {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
}
