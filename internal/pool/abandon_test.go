package pool

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// records parses the JSON log lines in out.
func records(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(out) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		recs = append(recs, rec)
	}
	return recs
}

// noFailureLogged fails the test if a record from the first one whose msg
// is from on is a warning or an error.
func noFailureLogged(t *testing.T, recs []map[string]any, from string) {
	t.Helper()
	i := slices.IndexFunc(recs, func(r map[string]any) bool { return r["msg"] == from })
	if i < 0 {
		t.Fatalf("no %q in the log", from)
	}
	for _, r := range recs[i:] {
		if r["level"] == "WARN" || r["level"] == "ERROR" {
			t.Errorf("an intended cancel logged %v %q: %v", r["level"], r["msg"], r)
		}
	}
}

// A shutdown while a sleeping engine wakes is no failure: nothing is logged
// as a warning or an error, no engine is started cold in its place, and the
// engine counts as stopped, not as a failed load.
func TestShutdownDuringWakeIsNoFailure(t *testing.T) {
	cfg := reloadConfig(t, sleepPool, sleepProfile("x", "--sim-wake-delay", "1m"), sleepProfile("y"))
	var logs logSink
	obs := &exitObserver{}
	s, stop := runSleepSet(t, cfg, Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Observer: obs})
	waitFor(t, s, "a", "x ready", readyWith("x"))
	use(t, s, cfg, "y")
	waitFor(t, s, "a", "x asleep", asleep("x"))

	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		l, err := s.Acquire(ctx, cfg.Lookup("x"), "", Caller{}, nil)
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), `"msg":"waking engine"`); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("x was not woken")
		}
	}
	stop()
	if err := <-got; err == nil {
		t.Fatal("a request for x got a lease from a pool that stopped while x woke")
	}
	recs := records(t, logs.String())
	noFailureLogged(t, recs, "waking engine")
	i := slices.IndexFunc(recs, func(r map[string]any) bool { return r["msg"] == "waking engine" })
	for _, r := range recs[i:] {
		if r["msg"] == "starting engine" {
			t.Errorf("an engine was started while the pool stopped: %v", r)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if slices.Contains(obs.exits, "x:load_failed") {
		t.Errorf("engine exits %v: the abandoned wake counted as a failed load", obs.exits)
	}
}

// A shutdown while the engine swapped out is put to sleep is no failure
// either: the engine is stopped instead, as poold stops anyway.
func TestShutdownDuringSleepIsNoFailure(t *testing.T) {
	asked := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/sleep" {
			close(asked)
			<-r.Context().Done() // sleeping takes longer than the pool lives
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	cfg := reloadConfig(t, sleepPool, sleepProfile("x"))
	var logs logSink
	p := NewSet(cfg, Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}).Pool("a")
	prof, spec := cfg.Lookup("x"), cfg.Pool("a")
	// The engine as the pool started it, but served by srv: no process.
	e := &engine{profile: prof, port: port, argv: prof.Argv(port, spec, p.opts.Launch), env: engineEnv(prof, spec), api: p.http.At(port), h: servedAt(port)}
	p.state = StateStopping // as swap leaves it before sleepOut
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-asked
		p.log.Info("test: the pool stops")
		cancel()
	}()
	if p.sleepOut(ctx, e, false) {
		t.Fatal("the engine was kept asleep although its sleep was cut")
	}
	noFailureLogged(t, records(t, logs.String()), "test: the pool stops")
}
