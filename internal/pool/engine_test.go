package pool

import (
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
)

// An engine's output is read asynchronously: its failure waits for the last
// lines, here written by a descendant after the engine itself exited.
func TestFailureWaitsForLastOutput(t *testing.T) {
	cfg, err := profile.Parse([]byte(`{
	  "pools": [{"name": "g", "gpus": [0]}],
	  "profiles": [{"id": "s", "model": "m", "command": ["sh", "-c", "echo first; (sleep 0.3; echo last-words) & exit 3 # {port}"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(cfg.Pool("g"), cfg, Options{})
	e, err := startEngine(cfg.Lookup("s"), cfg.Pool("g"), "", nil, p.opts.Containment, p.http, p.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.stop(0, p.log) })
	select {
	case <-e.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not exit")
	}
	msg := e.failure().Error()
	if !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "first | last-words") {
		t.Fatalf("failure %q lacks the exit status or the last output", msg)
	}
}
