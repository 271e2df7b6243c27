package enginesim

import (
	"bytes"
	"context"
	"errors"
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

// --sim-fail-requests: the engine looks ready but answers every POST with 500.
func TestFailRequests(t *testing.T) {
	_, ts := newTestServer(t, "--sim-fail-requests")
	if resp, _ := do(t, "GET", ts.URL+"/v1/models", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/models: %d", resp.StatusCode)
	}
	resp, body := do(t, "POST", ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusInternalServerError || !bytes.Contains(body, []byte("simulated failure")) {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
}
