package fleet

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/poold/poold/internal/statusapi"
)

// syncBuffer is a bytes.Buffer that the handler's goroutines may write
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fleetd's access-log line names its fields as poold's does, in snake_case.
func TestAccessLogFieldNames(t *testing.T) {
	awake := newFakeHost(t, "awake", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"))
	var out syncBuffer
	tf := startFleet(t, Options{}, HandlerOptions{AccessLog: slog.New(slog.NewJSONHandler(&out, nil))}, awake)
	resp, _ := tf.post(chat)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d", resp.StatusCode)
	}
	// The line is written as the handler returns, which may be after the
	// client has the answer.
	var line map[string]any
	waitFor(t, "the access-log line", func() bool { return json.Unmarshal([]byte(out.String()), &line) == nil })
	if line["msg"] != "request" || line["request_id"] != resp.Header.Get("X-Request-Id") || line["status"] != 200.0 || line["host"] != "awake" || line["model"] != "chat" || line["path"] != "/v1/chat/completions" {
		t.Fatalf("access log line %v", line)
	}
	for _, k := range []string{"duration_ms", "ttfb_ms", "stream", "reason", "tier"} {
		if _, ok := line[k]; !ok {
			t.Errorf("access log line %v lacks %s", line, k)
		}
	}
	for k := range line {
		if k != strings.ToLower(k) {
			t.Errorf("field %s is not in snake_case", k)
		}
	}
}
