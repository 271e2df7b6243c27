package enginesim

import (
	"fmt"
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

// A finished request counts in vllm:request_success_total by its
// finished_reason, and in the queue-time and token-count histograms, whose
// buckets are vLLM's; vllm:num_preemptions_total and vllm:cache_config_info
// are there as in vLLM.
func TestRequestMetrics(t *testing.T) {
	_, ts := newTestServer(t)
	post(t, ts.URL+"/v1/completions", `{"model":"m1","prompt":"a b","max_tokens":3}`, http.StatusOK)
	post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a b c"}]}`, http.StatusOK)
	post(t, ts.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a"}],"max_tokens":1,"stream":true}`, http.StatusOK)
	_, b := do(t, http.MethodGet, ts.URL+"/metrics", "")
	text := string(b)
	for _, want := range []string{
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="m1"} 2`,
		`vllm:request_success_total{engine="0",finished_reason="stop",model_name="m1"} 1`,
		`vllm:request_success_total{engine="0",finished_reason="abort",model_name="m1"} 0`,
		`vllm:request_success_total{engine="0",finished_reason="error",model_name="m1"} 0`,
		series("vllm:num_preemptions_total") + " 0",
		series("vllm:request_queue_time_seconds_count") + " 3",
		series("vllm:request_prompt_tokens_sum") + " 6",
		series("vllm:request_generation_tokens_sum") + " 8",
		series("vllm:e2e_request_latency_seconds_count") + " 3",
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="m1",le="1"} 1`,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="m1",le="100"} 3`,
		`vllm:request_generation_tokens_bucket{engine="0",model_name="m1",le="2"} 1`,
		`vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m1",le="0.01"}`,
		`vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m1",le="80"}`,
		`vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m1",le="0.3"}`,
		`vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m1",le="7680"}`,
		`vllm:request_queue_time_seconds_bucket{engine="0",model_name="m1",le="7680"}`,
		`vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m1",le="0.001"}`,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="1600"} 1`,
	} {
		if !strings.Contains(text, want+"\n") && !strings.Contains(text, want+" ") {
			t.Errorf("no %s in the metrics", want)
		}
	}
	for _, absent := range []string{
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="m1",le="200"}`,
		`vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m1",le="0.001"}`,
		`vllm:e2e_request_latency_seconds_bucket{engine="0",model_name="m1",le="0.001"}`,
	} {
		if strings.Contains(text, absent) {
			t.Errorf("%s is not one of vLLM's buckets", absent)
		}
	}
}

// A request that the end of --shutdown-timeout aborted counts as
// finished_reason "abort".
func TestAbortedRequestMetric(t *testing.T) {
	s, ts := newTestServer(t, "--sim-ttft", "1h")
	r := send(ts.URL+"/v1/completions", `{"model":"m1","prompt":"x"}`)
	waitRunning(t, s, 1)
	s.shutdown(time.Millisecond)
	answered(t, r, "aborted request")
	_, b := do(t, http.MethodGet, ts.URL+"/metrics", "")
	if want := `vllm:request_success_total{engine="0",finished_reason="abort",model_name="m1"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("no %s in\n%s", want, b)
	}
}

func TestBuckets125(t *testing.T) {
	for max, want := range map[int]string{100: "[1 2 5 10 20 50 100]", 4096: "[1 2 5 10 20 50 100 200 500 1000 2000]", 1: "[1]"} {
		if got := fmt.Sprint(buckets125(max)); got != want {
			t.Errorf("buckets125(%d) = %s, want %s", max, got, want)
		}
	}
}
