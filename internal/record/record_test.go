package record

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The access-log line of a stream carries its TTFT and ITL; a plain
// answer's does not.
func TestAccessLogStreamTiming(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	(&Request{Status: 200, Stream: true, TTFT: 212 * time.Millisecond, ITLGaps: 40, ITLP50: 51 * time.Millisecond, ITLMax: 340 * time.Millisecond}).Log(log)
	(&Request{Status: 200}).Log(log)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var stream, plain map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &stream); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &plain); err != nil {
		t.Fatal(err)
	}
	if stream["ttft_ms"] != 212.0 || stream["itl_ms_p50"] != 51.0 || stream["itl_ms_max"] != 340.0 {
		t.Errorf("stream line %s: want ttft_ms 212, itl_ms_p50 51, itl_ms_max 340", lines[0])
	}
	for _, k := range []string{"ttft_ms", "itl_ms_p50", "itl_ms_max"} {
		if _, ok := plain[k]; ok {
			t.Errorf("plain answer's line has %s: %s", k, lines[1])
		}
	}
}

// The access-log line records the keep_alive a request asked, in
// milliseconds, -1 for as long as allowed; a request without one has none.
func TestAccessLogKeepAlive(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	(&Request{Status: 200, HasKeepAlive: true, KeepAlive: 10 * time.Minute}).Log(log)
	(&Request{Status: 200, HasKeepAlive: true, KeepAlive: -1}).Log(log)
	(&Request{Status: 200, HasKeepAlive: true}).Log(log)
	(&Request{Status: 200}).Log(log)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	for i, want := range []any{600000.0, -1.0, 0.0, nil} {
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &m); err != nil {
			t.Fatal(err)
		}
		if got := m["keep_alive_ms"]; got != want {
			t.Errorf("line %s: keep_alive_ms %v, want %v", lines[i], got, want)
		}
	}
}

// poold's access-log line has the fields docs/observability.md names, in
// snake_case, as fleetd's line spells those it shares.
func TestAccessLogFields(t *testing.T) {
	var buf bytes.Buffer
	(&Request{RequestID: "r1", Status: 200, Stream: true, TTFT: time.Millisecond, ITLGaps: 2, HasKeepAlive: true}).Log(slog.New(slog.NewJSONHandler(&buf, nil)))
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	want := []string{"time", "level", "msg", "request_id", "pool", "model", "profile", "client", "status", "stream", "outcome",
		"prompt_tokens", "completion_tokens", "tokens_estimated", "queue_wait_ms", "ttfb_ms", "duration_ms",
		"ttft_ms", "itl_ms_p50", "itl_ms_max", "keep_alive_ms"}
	if len(line) != len(want) {
		t.Errorf("line %s: %d fields, want %d", buf.Bytes(), len(line), len(want))
	}
	for _, k := range want {
		if _, ok := line[k]; !ok {
			t.Errorf("line %s lacks %s", buf.Bytes(), k)
		}
	}
	if line["msg"] != "request" || line["request_id"] != "r1" {
		t.Errorf("line %s", buf.Bytes())
	}
}
