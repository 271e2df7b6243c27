package pool

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
)

// The /health poller fails an engine over on a 503 only: not on a 200, a
// 500 (a request's error) or a 404 (an engine without /health).
func TestHealthPollerSeesADeadCore(t *testing.T) {
	var polls atomic.Int32
	f := newFakeEngine(t, "m", func(call string) (int, string) {
		if call != "GET /health" {
			return 0, ""
		}
		switch polls.Add(1) {
		case 1:
			return http.StatusOK, ""
		case 2:
			return http.StatusInternalServerError, ""
		case 3:
			return http.StatusNotFound, ""
		}
		return http.StatusServiceUnavailable, ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := f.pollHealth(ctx, 5*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `engine "m" failed over: GET /health answered 503 Service Unavailable: its engine core is dead`) {
		t.Fatalf("pollHealth: %v; want the dead core", err)
	}
	if n := polls.Load(); n != 4 {
		t.Fatalf("dead after %d polls, want 4", n)
	}
}

// The poller stops when asked to (the engine sleeps or stops), failing
// nothing.
func TestHealthPollerStops(t *testing.T) {
	f := newFakeEngine(t, "m", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.pollHealth(ctx, time.Millisecond) }()
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Contains(f.recorded(), "GET /health") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a live engine failed: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the poller did not stop")
	}
}

// An engine whose port refuses connections, poll after poll, has died
// without its exit being seen (its supervisor did not report it): the
// poller fails it.
func TestHealthPollerFailsAnEngineThatRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	e := &engine{
		profile: &profile.Profile{ID: "m"},
		port:    port,
		h:       servedAt(port),
		api:     proc.NewClients(nil, nil).At(port),
		logs:    proc.NewOutput(logLines),
	}
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = e.pollHealth(ctx, 5*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `engine "m" failed: GET /health was refused`) {
		t.Fatalf("pollHealth: %v; want the refusals", err)
	}
}
