package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// In --log-format json every line of poold's log parses; an engine's output
// is a field of its own; the start-up line says what poold runs with; a
// reload names what it changed.
func TestDaemonLogJSON(t *testing.T) {
	tag := t.Name()
	settings := filepath.Join(t.TempDir(), "poold.yaml")
	writeFile(t, settings, []byte("admin-token: tok\n"))
	pools := []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}
	first := profilesJSON(tag, pools, []sim{{ID: "a"}}, nil)
	d := startPoold(t, tag, first, "--config", settings, "--api-keys", "sk-1", "--watch=false")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	next := profilesJSON(tag, pools, []sim{{ID: "a"}, {ID: "b"}}, nil)
	writeFile(t, d.profiles, next)
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	d.waitConfig(next, 10*time.Second, "SIGHUP")
	var reloaded []map[string]any
	for deadline := time.Now().Add(10 * time.Second); len(reloaded) == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		reloaded = d.logLines("profiles reloaded")
	}
	gpuOn := gpuAvailable(t, d)
	d.stop()

	var engine, listening []map[string]any
	for line := range strings.Lines(d.stderr.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a log line that is not JSON: %q: %v", line, err)
		}
		switch rec["msg"] {
		case "engine output":
			engine = append(engine, rec)
		case "poold listening":
			listening = append(listening, rec)
		}
	}
	// The simulator logs in slog's text format: its lines arrive whole.
	i := slices.IndexFunc(engine, func(r map[string]any) bool {
		l, _ := r["line"].(string)
		return strings.HasPrefix(l, "time=") && strings.Contains(l, "level=INFO") && strings.Contains(l, "component=enginesim")
	})
	if i < 0 {
		t.Fatalf("no engine line as the engine printed it among %d engine records: %v", len(engine), engine)
	}
	if r := engine[i]; r["pool"] != "p0" || r["profile"] != "a" || r["pid"] == nil {
		t.Errorf("engine line without its pool, profile and pid: %v", r)
	}
	if len(listening) != 1 {
		t.Fatalf("%d start-up lines", len(listening))
	}
	for k, want := range map[string]any{"settings": settings, "profiles": d.profiles, "tenants": "none", "api_keys": true, "admin_api": true, "gpu_telemetry": gpuOn} {
		if got := listening[0][k]; got != want {
			t.Errorf("start-up line: %s = %v, want %v (%v)", k, got, want, listening[0])
		}
	}
	if len(reloaded) != 1 {
		t.Fatalf("%d 'profiles reloaded' lines", len(reloaded))
	}
	if added, _ := reloaded[0]["profiles_added"].([]any); !slices.Equal(added, []any{"b"}) || reloaded[0]["profiles_removed"] != nil {
		t.Errorf("reload line: %v, want profiles_added [b] and nothing removed", reloaded[0])
	}
	if affected, _ := reloaded[0]["pools_affected"].([]any); !slices.Equal(affected, []any{"p0"}) {
		t.Errorf("reload line: %v, want pools_affected [p0]", reloaded[0])
	}
}

// In --log-format text an engine's line reads as the engine printed it,
// after poold's time and its pool, profile and pid.
func TestDaemonLogTextEngineLines(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil), "--log-format", "text")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.stop()
	re := regexp.MustCompile(`(?m)^time=\S+ pool=p0 profile=a pid=\d+ \| time=\S+ level=INFO msg=.* component=enginesim`)
	if !re.MatchString(d.stderr.String()) {
		t.Fatalf("no raw engine line in the text log:\n%s", tail(d.stderr.String(), 30))
	}
	if strings.Contains(d.stderr.String(), `msg="time=`) {
		t.Fatalf("an engine line nested in poold's message:\n%s", tail(d.stderr.String(), 30))
	}
}

// An engine's access-log lines for poold's own polls of it (readiness,
// /health, /metrics) go to poold's log at debug level only, counted in
// poold_engine_log_dropped_lines_total; a client request's line is logged
// at info. With --engine-log-polls every line is logged at info and none is
// counted.
func TestEnginePollLinesDropped(t *testing.T) {
	for _, keep := range []bool{false, true} {
		tag := t.Name()
		d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil),
			"--engine-health-interval", "20ms", "--engine-metrics-interval", "20ms", "--engine-log-polls="+strconv.FormatBool(keep))
		d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
		d.chat("a")
		const series = `poold_engine_log_dropped_lines_total{pool="p0",reason="own_poll"}`
		// The polls go on: wait for a line of each, and the client's.
		levels := map[string]string{} // request line → the levels it was logged at
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			for _, m := range d.engineLines(` - "`) {
				l, _ := m["line"].(string)
				_, req, _ := strings.Cut(l, ` - "`)
				req, _, _ = strings.Cut(req, ` HTTP/1.1"`)
				if !strings.Contains(levels[req], m["level"].(string)) {
					levels[req] += m["level"].(string) + " "
				}
			}
			if levels["GET /v1/models"] != "" && levels["GET /health"] != "" && levels["GET /metrics"] != "" && levels["POST /v1/chat/completions"] != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("engine-log-polls %t: access lines logged %v; want polls of /v1/models, /health, /metrics and the client's chat", keep, levels)
			}
		}
		polls := "DEBUG "
		if keep {
			polls = "INFO "
		}
		for req, got := range levels {
			want := polls
			if !strings.HasPrefix(req, "GET ") {
				want = "INFO "
			}
			if got != want {
				t.Errorf("engine-log-polls %t: %s logged at %s, want %s", keep, req, got, want)
			}
		}
		if n := d.metricValue(series); keep && n != 0 || !keep && n < 3 {
			t.Errorf("engine-log-polls %t: %s = %v", keep, series, n)
		}
		d.stop()
	}
}

// gpuAvailable reads /status's gpu.available.
func gpuAvailable(t *testing.T, d *daemon) bool {
	t.Helper()
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		GPU struct {
			Available bool `json:"available"`
		} `json:"gpu"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.GPU.Available
}
