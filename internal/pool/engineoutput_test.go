package pool

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	e, err := startEngine(engineStart{Profile: cfg.Lookup("s"), Spec: cfg.Pool("g"), Supervisor: p.supervisor(), HTTP: p.http, Output: p.outputLog()})
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
		if rec["pool"] != "g" || rec["profile"] != "s" || rec["pid"] != float64(e.h.PID()) {
			t.Errorf("engine line without its pool, profile and pid: %v", rec)
		}
		l, _ := rec[EngineLine].(string)
		lines = append(lines, l)
	}
	if want := []string{`level=INFO msg="loading model"`, "done"}; strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("engine lines %q, want %q", lines, want)
	}
}

// The access-log lines of poold's own polls of an engine (a GET of
// /health, /metrics, /v1/models or /is_sleeping, any status, any query)
// are logged at debug level only, each counted, unless LogPolls; either way
// they are never among the last lines that say why an engine failed. Every
// other line, a client request's access line among them, is logged as
// always.
func TestPollLinesLeftOut(t *testing.T) {
	lines := []string{
		"INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server",
		`(APIServer pid=7) INFO:     127.0.0.1:40000 - "GET /v1/models HTTP/1.1" 200 OK`,
		`(APIServer pid=7) INFO:     127.0.0.1:40002 - "POST /v1/chat/completions HTTP/1.1" 200 OK`,
		`(APIServer pid=7) INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK`,
		"ValueError: the last real line",
		`(APIServer pid=7) INFO:     127.0.0.1:40000 - "GET /metrics HTTP/1.1" 200 OK`,
		`(APIServer pid=7) INFO:     127.0.0.1:40000 - "GET /health?x=1 HTTP/1.1" 503 Service Unavailable`,
	}
	polls := []bool{false, true, false, true, false, true, true}
	var script strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&script, "echo %s; ", shellQuote(l))
	}
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "g", "gpus": [0]}],
	  "profiles": [{"id": "s", "model": "m", "command": ["sh", "-c", ` + strconv.Quote(script.String()+"exit 1 # {port}") + `]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		var out logSink
		obs := &exitObserver{}
		p := newPool(cfg.Pool("g"), cfg, Options{Logger: slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})), Observer: obs, LogPolls: keep})
		e, err := startEngine(engineStart{Profile: cfg.Lookup("s"), Spec: cfg.Pool("g"), Supervisor: p.supervisor(), HTTP: p.http, Output: p.outputLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.stop(0, p.log) })
		select {
		case <-e.h.Exited():
		case <-time.After(30 * time.Second):
			t.Fatal("the engine did not exit")
		}
		msg := e.failure().Error()
		if want := lines[0] + " | " + lines[2] + " | " + lines[4]; !strings.HasSuffix(msg, "last output: "+want) {
			t.Errorf("LogPolls %t: failure %q, want its last output %q", keep, msg, want)
		}
		var got []string
		for line := range strings.Lines(out.String()) {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			if rec["msg"] == EngineOutput {
				got = append(got, fmt.Sprintf("%s %s", rec["level"], rec[EngineLine]))
			}
		}
		var want, dropped []string
		for i, l := range lines {
			level := "INFO"
			if polls[i] && !keep {
				level = "DEBUG"
				dropped = append(dropped, "g:"+DropOwnPoll)
			}
			want = append(want, level+" "+l)
		}
		if !slices.Equal(got, want) {
			t.Errorf("LogPolls %t: engine lines logged\n%q\nwant\n%q", keep, got, want)
		}
		obs.mu.Lock()
		if !slices.Equal(obs.dropped, dropped) {
			t.Errorf("LogPolls %t: counted dropped %q, want %q", keep, obs.dropped, dropped)
		}
		obs.mu.Unlock()
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
