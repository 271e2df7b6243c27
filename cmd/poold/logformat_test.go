package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/poold/poold/internal/pool"
)

// engineLog logs one engine output line as the pools do: with the pool, the
// profile and the pid given through With.
func engineLog(h slog.Handler, line string) {
	log := slog.New(h).With("component", "pool", "pool", "gpu0").With("profile", "qwen", "pid", 4242)
	log.Info(pool.EngineOutput, pool.EngineLine, line)
	log.Info("engine ready", "took", "1s")
}

// In the text format an engine's line reads as the engine printed it, after
// its pool, profile and pid; poold's own lines keep slog's format.
func TestTextLogEngineLineIsRaw(t *testing.T) {
	var out bytes.Buffer
	engineLog(logHandler(&out, "text", slog.LevelInfo), `time=x level=INFO msg="loading model" path="/m"`+"\x1b[0m\r")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", out.String())
	}
	_, rest, ok := strings.Cut(lines[0], " ")
	if want := `pool=gpu0 profile=qwen pid=4242 | time=x level=INFO msg="loading model" path="/m"\x1b[0m\x0d`; !ok || rest != want || !strings.HasPrefix(lines[0], "time=") {
		t.Errorf("engine line:\n%s\nwant time=… %s", lines[0], want)
	}
	if !strings.Contains(lines[1], `level=INFO msg="engine ready" component=pool pool=gpu0 profile=qwen pid=4242 took=1s`) {
		t.Errorf("poold's own line: %s", lines[1])
	}
}

// In the JSON format every line parses, and an engine's line is one string
// field beside the pool, profile and pid.
func TestJSONLogEngineLineIsAField(t *testing.T) {
	var out bytes.Buffer
	raw := `time=x level=INFO msg="loading model" path="/m"`
	engineLog(logHandler(&out, "json", slog.LevelInfo), raw)
	var recs []map[string]any
	for line := range strings.Lines(out.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		recs = append(recs, m)
	}
	if len(recs) != 2 {
		t.Fatalf("want 2 records, got %d", len(recs))
	}
	e := recs[0]
	if e["msg"] != pool.EngineOutput || e[pool.EngineLine] != raw || e["pool"] != "gpu0" || e["profile"] != "qwen" || e["pid"] != 4242.0 {
		t.Errorf("engine record %v", e)
	}
}
