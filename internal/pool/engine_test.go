package pool

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
)

// exitedEngine starts an engine that runs script with sh (which must
// mention {port}, in a comment say) and waits for it to exit.
func exitedEngine(t *testing.T, script string) *engine {
	t.Helper()
	cmd, _ := json.Marshal([]string{"sh", "-c", script})
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "g", "gpus": [0]}],
	  "profiles": [{"id": "s", "model": "m", "command": ` + string(cmd) + `}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(cfg.Pool("g"), cfg, Options{})
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
	return e
}

// An engine's output is read asynchronously: its failure waits for the last
// lines, here written by a descendant after the engine itself exited.
func TestFailureWaitsForLastOutput(t *testing.T) {
	e := exitedEngine(t, "echo first; (sleep 0.3; echo last-words) & exit 3 # {port}")
	msg := e.failure().Error()
	if !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "first | last-words") {
		t.Fatalf("failure %q lacks the exit status or the last output", msg)
	}
}

// An engine's failure names the reason it printed, the exception that
// ended its traceback, however many lines came after it (vLLM's API server
// prints its own traceback, its access log and its shutdown after the
// engine core's); not a line that points above for the cause.
func TestFailureNamesTheEnginesReason(t *testing.T) {
	e := exitedEngine(t, `echo "(EngineCore pid=7) ERROR 04-07 10:00:00 [core.py:1120] Traceback (most recent call last):"
echo "(EngineCore pid=7) ERROR 04-07 10:00:00 [core.py:1120] RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1"
echo "(APIServer pid=6) ERROR 04-07 10:00:00 [async_llm.py:525] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."
for i in 1 2 3 4 5 6; do echo "(APIServer pid=6) INFO: shutting down $i"; done
exit 1 # {port}`)
	msg := e.failure().Error()
	if !strings.Contains(msg, "reason: RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1; last output: ") ||
		!strings.Contains(msg, "shutting down 6") {
		t.Fatalf("failure %q: want the reason, then the last output", msg)
	}
}

// An engine that lists another model id fails its load with what it listed,
// not only "not ready".
func TestWaitReadySaysWhatWasListed(t *testing.T) {
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0]}`,
		strings.Replace(simProfile("x", []string{"a"}), `"--served-model-name","{id}"`, `"--served-model-name","other-name"`, 1))
	p := newPool(cfg.Pool("a"), cfg, Options{})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(engineStart{Profile: cfg.Lookup("x"), Spec: cfg.Pool("a"), Launch: profile.Launch{Self: self}, Supervisor: p.supervisor(), HTTP: p.http, Output: p.outputLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stop(0, p.log) })
	err = e.waitReady(context.Background(), 3*time.Second)
	if err == nil || !strings.Contains(err.Error(), `it lists ["other-name"], not "x"`) {
		t.Fatalf("waitReady: %v; want it to say what /v1/models listed", err)
	}
}

// A readiness probe cut by startupTimeout does not hide what the probes
// before it found: the error still says what /v1/models listed.
func TestWaitReadyKeepsWhatWasListedAtTheDeadline(t *testing.T) {
	first := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-first: // every probe after the first hangs until the deadline
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		default:
			close(first)
		}
		_, _ = io.WriteString(w, `{"data":[{"id":"other-name"}]}`)
	}))
	defer srv.Close()
	defer close(release)
	port, err := strconv.Atoi(srv.URL[strings.LastIndexByte(srv.URL, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	cfg := reloadConfig(t, `{"name": "a", "gpus": [0]}`, simProfile("x", []string{"a"}))
	e := &engine{profile: cfg.Lookup("x"), port: port, h: servedAt(port), api: proc.NewClients(nil, nil).At(port), logs: proc.NewOutput(logLines)}
	err = e.waitReady(context.Background(), 500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `it lists ["other-name"], not "x"`) {
		t.Fatalf("waitReady: %v; want it to say what /v1/models listed before the deadline", err)
	}
}
