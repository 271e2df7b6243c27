package fleet

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
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

// BenchmarkForwardTenants is BenchmarkForward with a tenants file of 10,000
// tenants in force, the request sent by one of them whose limits (in
// memory) never refuse it: the key's lookup, the limits, the usage read and
// the debit added to BenchmarkForward.
func BenchmarkForwardTenants(b *testing.B) {
	fh := newFakeHost(b, "a", []statusapi.Pool{readyPool("p", "chat", 0)}, model("chat", "chat"))
	var list []string
	for i := range 10000 {
		list = append(list, fmt.Sprintf(`{"name": "t%d", "keys": [%q], "tier": "shared", "rpm": 1000000000, "tpm": 1000000000}`, i, tenant.HashKey(fmt.Sprint("key-", i))))
	}
	path := filepath.Join(b.TempDir(), "tenants.json")
	if err := os.WriteFile(path, []byte(`{"tiers": {"shared": {"weight": 1}}, "tenants": [`+strings.Join(list, ",")+`]}`), 0o644); err != nil {
		b.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	ts, err := LoadTenants(path, TenantsOptions{Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	tf := startFleet(b, Options{Metrics: m}, HandlerOptions{Tenants: ts, AccessLog: slog.New(slog.NewJSONHandler(io.Discard, nil))}, fh)
	benchPost(b, tf.srv.URL, "Authorization", "Bearer key-5000")
}

// BenchmarkDirect is BenchmarkForward's request sent to the host directly.
func BenchmarkDirect(b *testing.B) {
	fh := newFakeHost(b, "a", nil)
	benchPost(b, fh.srv.URL)
}

// benchPost posts a chat request to base over and over, with header (pairs
// of name and value).
func benchPost(b *testing.B, base string, header ...string) {
	// The body of internal/proxy's BenchmarkParseRequest, not streamed.
	body := `{"model":"chat","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about GPUs and the patience of people who wait for them."}],"temperature":0.7,"max_tokens":256}`
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := c.Do(req)
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
