package upstream

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// An upstream that closes idle connections after a second (as vLLM's
// server does after VLLM_HTTP_TIMEOUT_KEEP_ALIVE): with no idle limit of
// its own below that, the Transport keeps connections the upstream closes;
// with WithIdleTimeout below it, the Transport closes them first, and still
// reuses a connection within its limit.
func TestIdleTimeoutBelowUpstreamKeepAlive(t *testing.T) {
	for _, tt := range []struct {
		name    string
		maxIdle time.Duration
	}{
		{"transport default", 0},
		{"below the upstream's", 500 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, conns := keepAliveServer(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }, time.Second)
			tr := &Transport{}
			defer tr.Close()
			ctx := WithIdleTimeout(context.Background(), tt.maxIdle)
			for i, gap := range []time.Duration{0, 100 * time.Millisecond, 1300 * time.Millisecond, 1300 * time.Millisecond} {
				time.Sleep(gap) // the idle time under test, not a wait for an event
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got := bodyOf(t, resp); got != "ok" {
					t.Fatalf("request %d: %q", i, got)
				}
			}
			closed := tr.UpstreamClosed()
			if tt.maxIdle == 0 {
				if closed == 0 {
					t.Fatal("the upstream closed no idle connection first; the test shows nothing")
				}
				return
			}
			if closed != 0 || conns.Load() != 3 {
				t.Fatalf("the upstream closed %d idle connections first, %d connections made; want 0 and 3 (the second request reused the first's)", closed, conns.Load())
			}
		})
	}
}
