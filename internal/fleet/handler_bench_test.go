package fleet

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/upstream"
)

// BenchmarkForward is one plain request through fleetd's handler to a host
// answering a small JSON body at once, at concurrency 1, access log and
// metrics on as in fleetd: fleetd's per-request cost plus two loopback round
// trips (BenchmarkDirect is one).
func BenchmarkForward(b *testing.B) {
	fh := newFakeHost(b, "a", []statusapi.Pool{readyPool("p", "chat", 0)}, model("chat", "chat"))
	tf := startFleet(b, Options{}, HandlerOptions{AccessLog: slog.New(slog.NewJSONHandler(io.Discard, nil))}, fh)
	benchPost(b, tf.srv.URL)
}

// BenchmarkDirect is BenchmarkForward's request sent to the host directly.
func BenchmarkDirect(b *testing.B) {
	fh := newFakeHost(b, "a", nil)
	benchPost(b, fh.srv.URL)
}

func benchPost(b *testing.B, base string) {
	// The body of internal/proxy's BenchmarkParseRequest, not streamed.
	body := `{"model":"chat","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about GPUs and the patience of people who wait for them."}],"temperature":0.7,"max_tokens":256}`
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}

// BenchmarkReverseProxy is the floor under BenchmarkForward: a bare
// httputil.ReverseProxy on the same Transport and buffers, with no parsing,
// routing, metrics or access log.
func BenchmarkReverseProxy(b *testing.B) {
	fh := newFakeHost(b, "a", nil)
	u, err := url.Parse(fh.srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport: &upstream.Transport{}, BufferPool: &upstream.BufferPool{}}
	srv := httptest.NewServer(rp)
	defer srv.Close()
	benchPost(b, srv.URL)
}
