package upstream

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/openai"
)

// dripServer answers an event stream: with ?events=N, N events each
// dripped a byte every 10 ms; without, bytes every 10 ms that never
// complete an event, until the client leaves.
func dripServer(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		var events int
		fmt.Sscan(r.URL.Query().Get("events"), &events)
		drip := func(s string) bool {
			for i := range len(s) {
				if _, err := io.WriteString(w, s[i:i+1]); err != nil || rc.Flush() != nil {
					return false
				}
				select {
				case <-time.After(10 * time.Millisecond): // the drip's pace under test
				case <-r.Context().Done():
					return false
				}
			}
			return true
		}
		if events == 0 {
			drip(strings.Repeat("x", 1<<20)) // ends with the client
			return
		}
		for i := range events {
			if !drip(fmt.Sprintf("data: %d\n\n", i)) {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// readEvents reads resp's body through an SSEReader whose events reset
// the body's idle clock, as the daemons read streams.
func readEvents(resp *http.Response) (string, error) {
	sse := openai.NewSSEReader(resp.Body, false, nil)
	sse.OnEvent(IdleByEvents(resp.Body))
	defer sse.Close()
	b, err := io.ReadAll(sse)
	return string(b), err
}

// Under IdleByEvents, an upstream that drips bytes without completing an
// event times out within about the idle timeout, although a byte comes
// every 10 ms; one whose events come within the timeout, each dripped
// over more than the timeout's worth of reads, does not.
func TestTransportIdleByEvents(t *testing.T) {
	const idle = 300 * time.Millisecond
	url := dripServer(t)
	tr := &Transport{BodyIdleTimeout: idle}
	defer tr.Close()

	resp, err := post(t, tr, url, "")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := readEvents(resp)
	took := time.Since(start)
	if !errors.Is(err, ErrBodyIdle) || !strings.Contains(err.Error(), "no complete event") {
		t.Fatalf("a dripping stream: err %v; want ErrBodyIdle for no complete event", err)
	}
	if took > 10*idle {
		t.Fatalf("a dripping stream timed out after %s; want about %s", took, idle)
	}
	if !strings.Contains(got, "engine_stream_failed") {
		t.Fatalf("a dripping stream ended with %q; want an error event", got)
	}

	// 15 events of 10 bytes or so: each takes 100 ms, the stream 1.5 s.
	resp, err = post(t, tr, url+"/?events=15", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err = readEvents(resp)
	if err != nil || !strings.Contains(got, "data: 14\n\n") {
		t.Fatalf("events within the idle timeout: read %q, err %v; want all 15", got, err)
	}
}

// Without IdleByEvents, the clock runs between reads: the same drip is
// never timed out (here, read for 5 idle timeouts), which is what an
// event stream's idle clock fixes.
func TestTransportIdleByBytesDrip(t *testing.T) {
	const idle = 200 * time.Millisecond
	tr := &Transport{BodyIdleTimeout: idle}
	defer tr.Close()
	resp, err := post(t, tr, dripServer(t), "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	for end := time.Now().Add(5 * idle); time.Now().Before(end); {
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatalf("a dripping plain body: %v; want bytes for as long as they come", err)
		}
	}
}
