package fleet

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
)

// On the Messages route fleetd's own refusals and the event that ends a
// stream its host broke off are in Anthropic's shape, with fleetd's code;
// on the chat route the refusal stays OpenAI's.
func TestMessagesRouteErrorsInAnthropicShape(t *testing.T) {
	breaks := newFakeHost(t, "breaks", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	breaks.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: ping\ndata: {\"type\":\"ping\"}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the host dies mid-stream
		}
	})
	tf := startFleet(t, Options{}, HandlerOptions{}, breaks)
	post := func(path, body string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Post(tf.srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body) // a cut stream ends in an error, after its bytes
		return resp, string(b)
	}
	type anthropicErr struct {
		Type  string
		Error struct{ Type, Message, Code string }
	}

	for _, tt := range []struct {
		body      string
		status    int
		typ, code string
	}{
		{`{"model": "nope"}`, http.StatusNotFound, "not_found_error", "model_not_found"},
		{`{"model": `, http.StatusBadRequest, "invalid_request_error", "invalid_body"},
	} {
		resp, got := post("/v1/messages", tt.body)
		var e anthropicErr
		if json.Unmarshal([]byte(got), &e) != nil || resp.StatusCode != tt.status || e.Type != "error" || e.Error.Message == "" ||
			e.Error.Type != tt.typ || e.Error.Code != tt.code {
			t.Errorf("%s to /v1/messages: %d %s", tt.body, resp.StatusCode, got)
		}
	}
	resp, got := post("/v1/chat/completions", `{"model": "nope"}`)
	var oe struct{ Error struct{ Type, Code string } }
	if json.Unmarshal([]byte(got), &oe) != nil || resp.StatusCode != http.StatusNotFound || oe.Error.Code != "model_not_found" || oe.Error.Type != "not_found_error" {
		t.Errorf("unknown model to /v1/chat/completions: %d %s", resp.StatusCode, got)
	}

	_, got = post("/v1/messages", `{"model": "qwen", "stream": true}`)
	rest, ok := strings.CutPrefix(got, "event: ping\ndata: {\"type\":\"ping\"}\n\n")
	data, isEvent := strings.CutPrefix(rest, "event: error\ndata: ")
	var e anthropicErr
	if !ok || !isEvent || json.Unmarshal([]byte(data), &e) != nil || e.Type != "error" ||
		e.Error.Type != "api_error" || e.Error.Code != "host_failed" || !strings.Contains(e.Error.Message, `host "breaks" failed`) {
		t.Fatalf("cut Messages stream %q, want Anthropic's error event naming the host", got)
	}
}
