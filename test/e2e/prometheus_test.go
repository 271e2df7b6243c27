package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// promResult is the part of a Prometheus API answer the test reads.
type promResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

func promGet(t *testing.T, base, path string, q url.Values) promResult {
	t.Helper()
	resp, err := http.Get(base + path + "?" + q.Encode())
	if err != nil {
		return promResult{Status: "unreachable", Error: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusServiceUnavailable {
		// Prometheus answers 503 (plain text) until its TSDB is open and its
		// rules are loaded: not ready yet, to be asked again.
		return promResult{Status: "unavailable", Error: strings.TrimSpace(string(b))}
	}
	var r promResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return r
}

// waitPromReady polls Prometheus's /-/ready until it answers 200, failing
// after timeout. A busy machine can take many seconds to open the TSDB.
func waitPromReady(t *testing.T, base string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("prometheus not ready within %s; last: %s", timeout, last)
}

// waitSeries polls an instant query until it returns a series, failing after timeout.
func waitSeries(t *testing.T, base, query string, timeout time.Duration) promResult {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last promResult
	for time.Now().Before(deadline) {
		last = promGet(t, base, "/api/v1/query", url.Values{"query": {query}})
		if last.Status == "success" && len(last.Data.Result) > 0 {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("query %q returned no series within %s; last: %+v", query, timeout, last)
	return last
}

// A real Prometheus server scrapes a running poold (and its engine through
// /pools/{pool}/metrics), loads poold's rules, and its API returns
// poold_requests_total and the recording rules' series; every dashboard query
// is valid PromQL for it.
func TestPrometheusScrapesPoold(t *testing.T) {
	promBin := requireTool(t, "prometheus")
	if promBin == "" {
		t.Skip("prometheus not installed")
	}
	rules, err := filepath.Abs("../../deploy/prometheus/poold-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m"}}, nil),
		"--tenants", writeTenants(t, threeTenants))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for i := range 3 {
		hdr := bearer(teamAKey)
		if i == 0 {
			hdr = bearer(restKey)
		}
		if code, _, body := d.send(context.Background(), "/v1/chat/completions", chatBody("m", false, 3), hdr); code != http.StatusOK {
			t.Fatalf("chat: %d %s", code, body)
		}
	}

	dir := t.TempDir()
	target := strings.TrimPrefix(d.url, "http://")
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: poold
    static_configs:
      - targets: [%q]
  - job_name: vllm
    metrics_path: /pools/p0/metrics
    static_configs:
      - targets: [%q]
        labels: {pool: p0}
`, rules, target, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	var out lockedBuffer
	prom := exec.Command(promBin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	prom.Stdout, prom.Stderr = &out, &out
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = prom.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = prom.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = prom.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", tail(out.String(), 40))
		}
	})
	base := "http://" + addr
	waitPromReady(t, base, 2*time.Minute)

	r := waitSeries(t, base, `poold_requests_total{job="poold"}`, 2*time.Minute)
	classes := map[string]bool{}
	for _, s := range r.Data.Result {
		classes[s.Metric["client"]] = true
		if s.Metric["profile"] != "m" {
			t.Errorf("poold_requests_total series %v: want profile m", s.Metric)
		}
	}
	if !classes["team-a"] || !classes["rest"] {
		t.Errorf("clients in Prometheus: %v, want the tenants team-a and rest", classes)
	}
	for _, q := range []string{
		`profile:poold_completion_tokens:rate5m{profile="m"}`, `profile:poold_prompt_tokens:rate5m{profile="m"}`,
		"client:poold_completion_tokens:rate5m", "client:poold_prompt_tokens:rate5m",
		`vllm:prompt_tokens_total{job="vllm",pool="p0"}`,
	} {
		waitSeries(t, base, q, 2*time.Minute)
	}
	// Every rule loaded and evaluates without error.
	rr := promGet(t, base, "/api/v1/rules", nil)
	n := 0
	for _, g := range rr.Data.Groups {
		for _, rule := range g.Rules {
			n++
			if rule.Health == "err" {
				t.Errorf("rule %s: %s", rule.Name, rule.LastError)
			}
		}
	}
	if n != 35 {
		t.Errorf("Prometheus loaded %d rules, want 35", n)
	}
	// Every dashboard query is valid PromQL for this server.
	raw, err := os.ReadFile("../../deploy/grafana/poold-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	collectExprs(dash, &exprs)
	if len(exprs) < 15 {
		t.Fatalf("found %d dashboard queries", len(exprs))
	}
	vars := strings.NewReplacer("$instance", ".*", "$__rate_interval", "1m")
	for _, e := range exprs {
		if res := promGet(t, base, "/api/v1/query", url.Values{"query": {vars.Replace(e)}}); res.Status != "success" {
			t.Errorf("dashboard query %q: %s", e, res.Error)
		}
	}
}

// collectExprs gathers the "expr" strings of a Grafana dashboard's panels.
func collectExprs(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			if s, ok := c.(string); ok && k == "expr" {
				*out = append(*out, s)
				continue
			}
			collectExprs(c, out)
		}
	case []any:
		for _, c := range v {
			collectExprs(c, out)
		}
	}
}
