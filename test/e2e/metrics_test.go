package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The API keys of the tenants of threeTenants. They must never appear in
// poold's logs or metrics.
const (
	teamAKey = "sk-team-a-0123456789-SECRET"
	batchKey = "sk-batch-0123456789-SECRET"
	restKey  = "sk-rest-0123456789-SECRET"
)

// threeTenants is a tenants file: team-a, batch and rest, without limits.
var threeTenants = tenantsJSON(
	tenantSpec{Name: "team-a", Key: teamAKey},
	tenantSpec{Name: "batch", Key: batchKey},
	tenantSpec{Name: "rest", Key: restKey})

// bearer is the header that presents key.
func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// writeSettings writes a settings file for --config.
func writeSettings(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "poold.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// send posts body to path with extra headers and returns the status, the
// request id and the body.
func (d *daemon) send(ctx context.Context, path, body string, hdr map[string]string) (int, string, []byte) {
	d.t.Helper()
	code, h, b := sendTo(ctx, d.t, d.url+path, body, hdr)
	return code, h.Get("X-Request-Id"), b
}

// sendTo posts a JSON body to url with the headers hdr, and returns the
// status, the headers and the body.
func sendTo(ctx context.Context, t *testing.T, url, body string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", url, err)
	}
	return resp.StatusCode, resp.Header, b
}

// scrape fetches url (a /metrics endpoint) and returns its raw body and parsed
// families.
func scrape(t *testing.T, url string) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return body, mfs
}

// series renders one family as "{label="value",...} value" lines, sorted, the
// labels in name order; histograms give their sample count.
func series(mfs map[string]*dto.MetricFamily, name string) []string {
	var out []string
	for _, m := range mfs[name].GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		sort.Strings(labels)
		var v float64
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Histogram != nil:
			v = float64(m.Histogram.GetSampleCount())
		}
		out = append(out, fmt.Sprintf("{%s} %g", strings.Join(labels, ","), v))
	}
	sort.Strings(out)
	return out
}

func checkSeries(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want ...string) {
	t.Helper()
	sort.Strings(want)
	got := series(mfs, name)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got %s\nwant %s", name, strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// usageOf reads the usage of a non-streaming response, or of the usage chunk of
// a stream that asked for it.
func usageOf(t *testing.T, body []byte, stream bool) (prompt, completion int) {
	t.Helper()
	var u struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if !stream {
		if err := json.Unmarshal(body, &u); err != nil || u.Usage == nil {
			t.Fatalf("no usage in %s (%v)", body, err)
		}
		return u.Usage.PromptTokens, u.Usage.CompletionTokens
	}
	for _, ev := range sseEvents(body) {
		if json.Unmarshal([]byte(ev), &u) == nil && u.Usage != nil {
			return u.Usage.PromptTokens, u.Usage.CompletionTokens
		}
	}
	t.Fatalf("no usage chunk in %s", body)
	return 0, 0
}

// accessLines reads the JSON access log file, by request id.
func accessLines(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := make(map[string]map[string]any)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("access log line is not JSON: %v: %s", err, sc.Text())
		}
		out[m["request_id"].(string)] = m
	}
	return out
}

// TestMetricsAfterKnownSequence runs a known sequence (five requests from three
// client classes, an unknown model, one swap, one failed load, one client
// disconnect) and checks the exact counters, the access log, the engine
// metrics passthrough and that the exposition lints clean.
func TestMetricsAfterKnownSequence(t *testing.T) {
	tag := t.Name()
	accessPath := filepath.Join(t.TempDir(), "access.log")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{
			{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}},
			{Name: "p1", GPUs: []int{1}},
		},
		[]sim{
			{ID: "a", Pools: []string{"p0"}},
			{ID: "b", Pools: []string{"p0"}, Flags: []string{"--sim-itl", "20ms"}},
			{ID: "broken", Pools: []string{"p1"}, Flags: []string{"--sim-fail-load"}},
		}, nil),
		"--tenants", writeTenants(t, threeTenants), "--access-log", accessPath)
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	ctx := context.Background()

	type sent struct {
		id                 string
		prompt, completion int
	}
	var all []sent
	ok := func(code int, id string, body []byte, stream bool) sent {
		t.Helper()
		if code != http.StatusOK {
			t.Fatalf("request %s: %d %s", id, code, body)
		}
		p, c := usageOf(t, body, stream)
		return sent{id, p, c}
	}
	// Five requests for a, from three tenants.
	code, id, body := d.send(ctx, "/v1/chat/completions", chatBody("a", false, 3), bearer(teamAKey))
	r1 := ok(code, id, body, false)
	code, id, body = d.send(ctx, "/v1/chat/completions", chatBody("a", false, 4), map[string]string{"X-Api-Key": teamAKey})
	r2 := ok(code, id, body, false)
	streamUsage := `{"model":"a","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"messages":[{"role":"user","content":"say something nice"}]}`
	code, id, body = d.send(ctx, "/v1/chat/completions", streamUsage, bearer(batchKey))
	r3 := ok(code, id, body, true)
	// A stream that did not ask for usage: poold asks and withholds it; the
	// engine's count is the same prompt and the 6 tokens asked for.
	code, id, body = d.send(ctx, "/v1/chat/completions", chatBody("a", true, 6), bearer(restKey))
	if code != http.StatusOK {
		t.Fatalf("stream: %d %s", code, body)
	}
	checkStream(t, body, "a", 6)
	r4 := sent{id, r1.prompt, 6}
	code, id, body = d.send(ctx, "/v1/chat/completions", chatBody("a", false, 7), bearer(restKey))
	r5 := ok(code, id, body, false)
	// An unknown key is refused before anything is counted.
	if code, _, body := d.send(ctx, "/v1/chat/completions", chatBody("a", false, 7), bearer("sk-unknown-"+tag)); code != http.StatusUnauthorized {
		t.Fatalf("an unknown key: %d %s", code, body)
	}
	all = append(all, r1, r2, r3, r4, r5)

	// The engine's own metrics, passed through poold, agree with poold's counts.
	_, engine := scrape(t, d.url+"/pools/p0/metrics")
	wantPrompt, wantGen := 0, 0
	for _, r := range all {
		wantPrompt += r.prompt
		wantGen += r.completion
	}
	checkSeries(t, engine, "vllm:prompt_tokens_total", fmt.Sprintf(`{engine="0",model_name="a"} %d`, wantPrompt))
	checkSeries(t, engine, "vllm:generation_tokens_total", fmt.Sprintf(`{engine="0",model_name="a"} %d`, wantGen))

	// An unknown model.
	if code, _, body := d.send(ctx, "/v1/chat/completions", chatBody("nope", false, 1), bearer(restKey)); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", code, body)
	}
	// One swap: b on p0.
	code, id, body = d.send(ctx, "/v1/chat/completions", chatBody("b", false, 2), bearer(restKey))
	r6 := ok(code, id, body, false)
	all = append(all, r6)
	// One failed load: broken on p1.
	if code, _, body := d.send(ctx, "/v1/chat/completions", chatBody("broken", false, 1), bearer(restKey)); code != http.StatusBadGateway {
		t.Fatalf("broken: %d %s", code, body)
	}
	// One client disconnect, mid-stream.
	cctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("b", true, 1000)))
	req.Header.Set("Authorization", "Bearer "+restKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	disconnectID := resp.Header.Get("X-Request-Id")
	// Read until the first chunk of generated text has arrived, then leave.
	var got []byte
	for buf := make([]byte, 256); !bytes.Contains(got, []byte(`"content":"tok`)); {
		n, err := resp.Body.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	cancel()
	resp.Body.Close()
	d.waitPool("p0", 5*time.Second, "disconnected lease released", func(p poolView) bool { return p.InFlight == 0 })

	raw, mfs := waitScrape(t, d, disconnectID, accessPath)
	// The abandoned stream's tokens are poold's estimate: the chunks of
	// text that reached the client (at least the one read), and its
	// prompt from the body's size.
	lines := accessLines(t, accessPath)
	estimate, promptEstimate := 0, 0
	if l := lines[disconnectID]; l["client"] != "rest" || l["outcome"] != "client_aborted" || l["tokens_estimated"] != true || l["completion_tokens"].(float64) < 1 || l["prompt_tokens"].(float64) < 1 {
		t.Errorf("access log for the disconnected stream: %v", l)
	} else {
		estimate, promptEstimate = int(l["completion_tokens"].(float64)), int(l["prompt_tokens"].(float64))
	}
	checkSeries(t, mfs, "poold_requests_total",
		`{client="team-a",code_class="2xx",outcome="completed",pool="p0",profile="a",stream="false"} 2`,
		`{client="batch",code_class="2xx",outcome="completed",pool="p0",profile="a",stream="true"} 1`,
		`{client="rest",code_class="2xx",outcome="completed",pool="p0",profile="a",stream="true"} 1`,
		`{client="rest",code_class="2xx",outcome="completed",pool="p0",profile="a",stream="false"} 1`,
		`{client="rest",code_class="4xx",outcome="completed",pool="none",profile="none",stream="false"} 1`,
		`{client="rest",code_class="2xx",outcome="completed",pool="p0",profile="b",stream="false"} 1`,
		`{client="rest",code_class="2xx",outcome="client_aborted",pool="p0",profile="b",stream="true"} 1`,
		`{client="rest",code_class="5xx",outcome="completed",pool="none",profile="broken",stream="false"} 1`,
	)
	checkSeries(t, mfs, "poold_prompt_tokens_total",
		fmt.Sprintf(`{client="team-a",pool="p0",profile="a"} %d`, r1.prompt+r2.prompt),
		fmt.Sprintf(`{client="batch",pool="p0",profile="a"} %d`, r3.prompt),
		fmt.Sprintf(`{client="rest",pool="p0",profile="a"} %d`, r4.prompt+r5.prompt),
		fmt.Sprintf(`{client="rest",pool="p0",profile="b"} %d`, r6.prompt+promptEstimate),
	)
	checkSeries(t, mfs, "poold_completion_tokens_total",
		`{client="team-a",pool="p0",profile="a"} 7`,
		`{client="batch",pool="p0",profile="a"} 5`,
		`{client="rest",pool="p0",profile="a"} 13`,
		fmt.Sprintf(`{client="rest",pool="p0",profile="b"} %d`, 2+estimate),
	)
	checkSeries(t, mfs, "poold_swaps_total",
		`{from="",pool="p0",result="ok",to="a"} 1`,
		`{from="a",pool="p0",result="ok",to="b"} 1`,
		`{from="",pool="p1",result="failed",to="broken"} 1`,
	)
	// Every configured pool and profile has its series, at zero until used.
	checkSeries(t, mfs, "poold_engine_starts_total",
		`{pool="p0",profile="a",result="ok"} 1`,
		`{pool="p0",profile="a",result="failed"} 0`,
		`{pool="p0",profile="b",result="ok"} 1`,
		`{pool="p0",profile="b",result="failed"} 0`,
		`{pool="p1",profile="broken",result="ok"} 0`,
		`{pool="p1",profile="broken",result="failed"} 1`,
	)
	checkSeries(t, mfs, "poold_engine_exits_total",
		`{pool="p0",profile="a",reason="stopped"} 1`,
		`{pool="p0",profile="a",reason="crashed"} 0`,
		`{pool="p0",profile="a",reason="load_failed"} 0`,
		`{pool="p0",profile="a",reason="first_request_failed"} 0`,
		`{pool="p0",profile="b",reason="stopped"} 0`,
		`{pool="p0",profile="b",reason="crashed"} 0`,
		`{pool="p0",profile="b",reason="load_failed"} 0`,
		`{pool="p0",profile="b",reason="first_request_failed"} 0`,
		`{pool="p1",profile="broken",reason="stopped"} 0`,
		`{pool="p1",profile="broken",reason="crashed"} 0`,
		`{pool="p1",profile="broken",reason="load_failed"} 1`,
		`{pool="p1",profile="broken",reason="first_request_failed"} 0`,
	)
	checkSeries(t, mfs, "poold_queue_wait_seconds", `{pool="p0",profile="a"} 5`, `{pool="p0",profile="b"} 2`)
	checkSeries(t, mfs, "poold_time_to_first_byte_seconds", `{pool="p0",profile="a"} 5`, `{pool="p0",profile="b"} 2`)
	checkSeries(t, mfs, "poold_pool_loaded_profile", `{pool="p0",profile="b"} 1`)
	checkSeries(t, mfs, "poold_in_flight_requests", `{pool="p0",profile="b"} 0`, `{pool="p1",profile=""} 0`)
	checkSeries(t, mfs, "poold_gpu_telemetry_available", `{} 0`)
	checkSeries(t, mfs, "poold_config_last_reload_successful", `{} 1`)
	// Swap phases: p0 stopped a once and started a and b; p1 started broken,
	// which never got ready. No NVML here, so no vram_release.
	phases := map[string]bool{}
	for _, s := range series(mfs, "poold_swap_duration_seconds") {
		phases[s] = true
	}
	for _, want := range []string{`{kind="cold",phase="stop",pool="p0"} 1`, `{kind="cold",phase="start",pool="p0"} 2`, `{kind="cold",phase="ready",pool="p0"} 2`, `{kind="cold",phase="start",pool="p1"} 1`} {
		if !phases[want] {
			t.Errorf("poold_swap_duration_seconds lacks %s: %v", want, phases)
		}
	}
	if mfs["poold_build_info"] == nil || mfs["go_goroutines"] == nil || mfs["process_resident_memory_bytes"] == nil {
		t.Errorf("build info, Go or process collectors missing")
	}

	// The live exposition lints clean, here and with promtool.
	problems, err := testutil.GatherAndLint(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		out := make([]*dto.MetricFamily, 0, len(mfs))
		for _, mf := range mfs {
			out = append(out, mf)
		}
		return out, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if promtool := requireTool(t, "promtool"); promtool != "" {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(raw)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}

	// One access-log line per request, with the engine's token counts.
	if len(lines) != 9 {
		t.Errorf("%d access-log lines, want 9 (one per request)", len(lines))
	}
	for _, r := range all {
		l := lines[r.id]
		if l == nil {
			t.Errorf("no access-log line for request %s", r.id)
			continue
		}
		if l["prompt_tokens"] != float64(r.prompt) || l["completion_tokens"] != float64(r.completion) {
			t.Errorf("access log for %s: tokens %v/%v, engine said %d/%d", r.id, l["prompt_tokens"], l["completion_tokens"], r.prompt, r.completion)
		}
	}
	if l := lines[r1.id]; l["client"] != "team-a" || l["status"] != 200.0 {
		t.Errorf("access log for r1: %v", l)
	}

	// The key never appears in logs or metrics.
	accessRaw, _ := os.ReadFile(accessPath)
	for what, s := range map[string]string{"access log": string(accessRaw), "daemon log": d.stderr.String(), "stdout": d.stdout.String(), "metrics": string(raw)} {
		if strings.Contains(s, teamAKey) || strings.Contains(s, batchKey) || strings.Contains(s, restKey) || strings.Contains(s, "sk-unknown-") {
			t.Errorf("an API key appears in the %s", what)
		}
	}
}

// waitScrape waits until the access log has the line of request id (the last
// one of the sequence: its record is written when its handler returns), then
// scrapes poold's /metrics.
func waitScrape(t *testing.T, d *daemon, id, accessPath string) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if raw, _ := os.ReadFile(accessPath); bytes.Contains(raw, []byte(`"request_id":"`+id+`"`)) {
			return scrape(t, d.url+"/metrics")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access-log line for request %s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// requireTool returns the path of a Prometheus tool, or "" after skipping the
// part of the test that needs it; with POOLD_REQUIRE_PROMETHEUS=1 (CI) a
// missing tool fails the test instead.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("POOLD_REQUIRE_PROMETHEUS") == "1" {
		t.Fatalf("%s is required (POOLD_REQUIRE_PROMETHEUS=1) but not found: %v", name, err)
	}
	t.Logf("%s not found; skipping its checks (set POOLD_REQUIRE_PROMETHEUS=1 to require it)", name)
	return ""
}
