package enginesim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With --max-num-seqs 1, a second request waits (counted in
// vllm:num_requests_waiting) until the first one ends, and a client that leaves
// while waiting leaves the queue.
func TestMaxNumSeqs(t *testing.T) {
	s, ts := newTestServer(t, "--max-num-seqs", "1", "--sim-itl", "1h", "--max-model-len", "100000")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions",
			strings.NewReader(`{"model":"m1","prompt":"x","max_tokens":10,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}
	first, err := stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	waitFor(t, 5*time.Second, "the first request running", func() bool { return s.runningNow() == 1 })

	waiting := func() bool {
		_, b := do(t, "GET", ts.URL+"/metrics", "")
		return strings.Contains(string(b), series("vllm:num_requests_waiting")+" 1\n")
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		if resp, err := stream(ctx2); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, 5*time.Second, "the second request waiting", waiting)
	if n := s.runningNow(); n != 1 {
		t.Fatalf("running = %d with one slot", n)
	}
	cancel2()
	<-gone
	waitFor(t, 5*time.Second, "the queue empty again", func() bool { return !waiting() })

	third := make(chan error, 1)
	go func() {
		resp, err := stream(context.Background())
		if err == nil {
			resp.Body.Close()
		}
		third <- err
	}()
	waitFor(t, 5*time.Second, "the third request waiting", waiting)
	select {
	case err := <-third:
		t.Fatalf("the third request was answered while the first held the slot: %v", err)
	default:
	}
	cancel() // the first request ends: the third takes its slot and answers
	select {
	case err := <-third:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the third request did not get the freed slot")
	}
}
