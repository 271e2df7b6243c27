package enginesim

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metric reads one series of the test server's metrics.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	_, b := do(t, http.MethodGet, url+"/metrics", "")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series(name)+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in\n%s", series(name), b)
	return 0
}

// vllm:kv_cache_usage_perc grows with the tokens in flight (the prompt,
// then each generated token) relative to the KV cache's capacity, and falls
// back when the request ends.
func TestKVCacheUsage(t *testing.T) {
	_, ts := newTestServer(t, "--sim-kv-capacity-tokens", "100", "--sim-itl", "20ms", "--max-model-len", "100")
	prompt := strings.TrimSpace(strings.Repeat("w ", 40))
	r := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"`+prompt+`","max_tokens":30}`)
	var first float64
	waitFor(t, 5*time.Second, "the prompt in the KV cache", func() bool {
		first = metric(t, ts.URL, "vllm:kv_cache_usage_perc")
		return first >= 0.41
	})
	waitFor(t, 5*time.Second, "the KV cache to grow with the generated tokens", func() bool {
		return metric(t, ts.URL, "vllm:kv_cache_usage_perc") > first
	})
	if res := answered(t, r, "the request"); res.status != http.StatusOK {
		t.Fatalf("%d %s", res.status, res.body)
	}
	waitFor(t, 5*time.Second, "the KV cache empty again", func() bool { return metric(t, ts.URL, "vllm:kv_cache_usage_perc") == 0 })
	if kvCapacity(Config{MaxModelLen: 1000, MaxNumSeqs: 8}) != 8000 || kvCapacity(Config{MaxModelLen: 1000}) != 256000 {
		t.Error("the default KV capacity is not max-model-len × max-num-seqs (256 unbounded)")
	}
}

// A repeated prompt hits the prefix cache by whole blocks of 16 tokens;
// queries count every prompt token. --no-enable-prefix-caching turns it off.
func TestPrefixCache(t *testing.T) {
	body := `{"model":"m1","prompt":"` + strings.TrimSpace(strings.Repeat("w ", 40)) + `","max_tokens":1}`
	for _, on := range []bool{true, false} {
		var extra []string
		if !on {
			extra = []string{"--no-enable-prefix-caching"}
		}
		_, ts := newTestServer(t, append(extra, "--max-model-len", "1000")...)
		post(t, ts.URL+"/v1/completions", body, http.StatusOK)
		if h := metric(t, ts.URL, "vllm:prefix_cache_hits_total"); h != 0 {
			t.Fatalf("hits after one prompt: %v", h)
		}
		post(t, ts.URL+"/v1/completions", body, http.StatusOK)
		q, h := metric(t, ts.URL, "vllm:prefix_cache_queries_total"), metric(t, ts.URL, "vllm:prefix_cache_hits_total")
		if on && (q != 80 || h != 32) || !on && (q != 0 || h != 0) {
			t.Errorf("caching %v: %v queries, %v hits", on, q, h)
		}
	}
}
