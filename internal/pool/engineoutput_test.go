package pool

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
)

// logSink is a bytes.Buffer for a test's log, safe for one writer and
// concurrent readers.
type logSink struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Each line an engine prints is logged as it was printed, in a field of its
// own, with the engine's pool, profile and pid: never as poold's message.
func TestEngineOutputLogged(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "g", "gpus": [0]}],
	  "profiles": [{"id": "s", "model": "m", "command": ["sh", "-c", "echo 'level=INFO msg=\"loading model\"'; echo done # {port}"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	var out logSink
	p := newPool(cfg.Pool("g"), cfg, Options{Logger: slog.New(slog.NewJSONHandler(&out, nil))})
	e, err := startEngine(cfg.Lookup("s"), cfg.Pool("g"), profile.Launch{}, nil, p.opts.Containment, nil, p.http, nil, p.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stop(0, p.log) })
	select {
	case <-e.pumped:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine's output was not read to its end")
	}
	var lines []string
	for line := range strings.Lines(out.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] != EngineOutput {
			continue
		}
		if rec["pool"] != "g" || rec["profile"] != "s" || rec["pid"] != float64(e.pid) {
			t.Errorf("engine line without its pool, profile and pid: %v", rec)
		}
		l, _ := rec[EngineLine].(string)
		lines = append(lines, l)
	}
	if want := []string{`level=INFO msg="loading model"`, "done"}; strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("engine lines %q, want %q", lines, want)
	}
}
