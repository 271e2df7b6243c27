package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/openai"
)

// Before anything was committed the keep-alive writer is transparent: an error
// keeps its status and Retry-After header.
func TestKeepAliveTransparentBeforeCommit(t *testing.T) {
	rec := httptest.NewRecorder()
	k := &keepAlive{ResponseWriter: rec}
	openai.WriteUnavailable(k, httptest.NewRequest("POST", "/v1/chat/completions", nil), "queue_full", "model \"m\": queue full", 3*time.Second)
	k.finish()
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("got %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	var e struct{ Error openaiError }
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != "queue_full" {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
}

// dataEvents returns the payloads of the SSE data lines in body, and the
// comment lines.
func dataEvents(body string) (data, comments []string) {
	for line := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, rest)
		} else if rest, ok := strings.CutPrefix(line, ": "); ok {
			comments = append(comments, rest)
		}
	}
	return data, comments
}

// After a keep-alive comment the response is a 200 event stream, so an error
// (here a queue timeout) arrives as the stream's last event, with the retry
// hint in its message.
func TestKeepAliveErrorAfterCommit(t *testing.T) {
	rec := httptest.NewRecorder()
	k := &keepAlive{ResponseWriter: rec}
	k.comment("loading m, 10s")
	k.comment("loading m, 20s")
	openai.WriteUnavailable(k, httptest.NewRequest("POST", "/v1/chat/completions", nil), "queue_timeout", `model "m": timed out waiting for the model to load`, 30*time.Second)
	k.finish()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if !rec.Flushed {
		t.Error("comments were not flushed")
	}
	data, comments := dataEvents(rec.Body.String())
	if strings.Join(comments, "|") != "loading m, 10s|loading m, 20s" || len(data) != 1 {
		t.Fatalf("body:\n%s", rec.Body)
	}
	var e struct{ Error openaiError }
	if err := json.Unmarshal([]byte(data[0]), &e); err != nil {
		t.Fatal(err)
	}
	want := `model "m": timed out waiting for the model to load (retry after 30s)`
	if e.Error.Message != want || e.Error.Code != "queue_timeout" || e.Error.Type != "service_unavailable" {
		t.Fatalf("error event %s", data[0])
	}
}

// An engine's successful stream after the commit passes through untouched.
func TestKeepAliveStreamAfterCommit(t *testing.T) {
	rec := httptest.NewRecorder()
	k := &keepAlive{ResponseWriter: rec}
	k.comment("loading m, 10s")
	k.Header().Set("Content-Type", "text/event-stream; charset=utf-8") // the engine's, too late
	k.WriteHeader(http.StatusOK)
	if _, err := k.Write([]byte("data: {\"x\":1}\n\ndata: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	k.finish()
	if got := rec.Body.String(); got != ": loading m, 10s\n\ndata: {\"x\":1}\n\ndata: [DONE]\n\n" {
		t.Fatalf("body %q", got)
	}
}

// An engine's error answer that is not OpenAI-shaped becomes the message of
// the error event, bounded.
func TestKeepAliveEngineErrorAfterCommit(t *testing.T) {
	rec := httptest.NewRecorder()
	k := &keepAlive{ResponseWriter: rec}
	k.comment("loading m, 10s")
	k.WriteHeader(http.StatusBadRequest)
	_, _ = k.Write([]byte("max_tokens too large " + strings.Repeat("x", 2*maxErrorBody)))
	k.finish()
	data, _ := dataEvents(rec.Body.String())
	var e struct{ Error openaiError }
	if len(data) != 1 || json.Unmarshal([]byte(data[0]), &e) != nil {
		t.Fatalf("body:\n%.300s", rec.Body)
	}
	if !strings.HasPrefix(e.Error.Message, "engine answered 400: max_tokens too large") || len(e.Error.Message) > maxErrorBody+100 ||
		e.Error.Type != "invalid_request_error" {
		t.Fatalf("error event %.300s", data[0])
	}
}

// On the Messages route, an error after the commit ends the stream with
// Anthropic's error event, the retry hint in its message; an engine's
// error answer that is no JSON becomes its message.
func TestKeepAliveErrorAfterCommitOnMessagesRoute(t *testing.T) {
	rec := httptest.NewRecorder()
	k := &keepAlive{ResponseWriter: rec, anthropic: true}
	k.comment("loading m, 10s")
	openai.WriteUnavailable(k, httptest.NewRequest("POST", "/pools/a/v1/messages", nil), "queue_timeout", `model "m": timed out`, 30*time.Second)
	k.finish()
	want := ": loading m, 10s\n\nevent: error\n" +
		`data: {"type":"error","error":{"type":"overloaded_error","message":"model \"m\": timed out (retry after 30s)","code":"queue_timeout"}}` + "\n\n"
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Fatalf("%d %q\nwant %q", rec.Code, rec.Body, want)
	}

	rec = httptest.NewRecorder()
	k = &keepAlive{ResponseWriter: rec, anthropic: true}
	k.comment("loading m, 10s")
	k.WriteHeader(http.StatusBadGateway)
	_, _ = k.Write([]byte("Bad Gateway"))
	k.finish()
	want = ": loading m, 10s\n\nevent: error\n" +
		`data: {"type":"error","error":{"type":"api_error","message":"engine answered 502: Bad Gateway","code":"engine_error"}}` + "\n\n"
	if rec.Body.String() != want {
		t.Fatalf("%q\nwant %q", rec.Body, want)
	}
}
