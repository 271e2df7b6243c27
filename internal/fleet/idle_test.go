package fleet

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// A host whose stream drips a byte every 20 ms without ever completing an
// event is timed out after the stream idle timeout: the client's stream
// ends with a host_timeout error event, the host's request is cancelled,
// and the answer counts as the model's failure on the host.
func TestDrippingHostStreamEnds(t *testing.T) {
	const idle = 300 * time.Millisecond
	cancelled := make(chan struct{})
	h := newFakeHost(t, "h", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("qwen", "qwen"))
	h.set(func(fh *fakeHost) {
		fh.post = func(w http.ResponseWriter, r *http.Request) {
			defer close(cancelled)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"n\": 1}\n\ndata: {")
			w.(http.Flusher).Flush()
			for range 3000 { // a minute at most
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond): // the drip's pace under test
				}
				if _, err := io.WriteString(w, "x"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
	})
	tf := startFleet(t, Options{}, HandlerOptions{StreamIdleTimeout: idle}, h)
	start := time.Now()
	resp, err := http.Post(tf.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model": "qwen", "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rest, _ := io.ReadAll(bufio.NewReader(resp.Body))
	took := time.Since(start)
	if !strings.Contains(string(rest), `"code":"host_timeout"`) || !strings.Contains(string(rest), "no complete event") {
		t.Fatalf("the dripping stream ended with %q; want a host_timeout error event", rest)
	}
	if took > 10*idle {
		t.Fatalf("the dripping stream ended after %s; want about %s", took, idle)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the host's request was not cancelled")
	}
	hs := tf.fleet.snapshot()["h"]
	waitFor(t, "the cut counted as a failure", func() bool {
		hs.mu.Lock()
		defer hs.mu.Unlock()
		m := hs.health["qwen"]
		return m != nil && m.fails == 1
	})
}
