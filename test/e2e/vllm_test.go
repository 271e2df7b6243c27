package e2e

// What real vLLM does that poold must get right (docs/gpu.md, "vLLM
// behaviour poold relies on"), against the simulator, which behaves as
// vLLM does on each point.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// simGPUs writes a simulated-GPU directory holding one GPU of total bytes
// per entry (GPU 0, 1, …) and returns its path.
func simGPUs(t *testing.T, totals ...uint64) string {
	t.Helper()
	dir := t.TempDir()
	doc := `{"gpus": [`
	for i, total := range totals {
		if i > 0 {
			doc += ", "
		}
		doc += fmt.Sprintf(`{"index": %d, "totalBytes": %d}`, i, total)
	}
	if err := os.WriteFile(filepath.Join(dir, "gpus.json"), []byte(doc+"]}"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// memorySleepers are two sleep-enabled profiles on one simulated GPU of 10
// GiB: each claims 9 GiB awake (vLLM's default --gpu-memory-utilization
// 0.9) and keeps 2 GiB asleep, so that the other cannot start beside it.
func memorySleepers(t *testing.T, tag string) ([]byte, string) {
	dir := simGPUs(t, 10<<30)
	flags := []string{"--enable-sleep-mode", "--sim-gpu-dir", dir, "--sim-sleep-residue-mib", "2048"}
	extra := map[string]any{"sleep": map[string]any{"level": 1}, "weightBytes": 1000}
	return profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{{ID: "a", Flags: flags, Extra: extra}, {ID: "b", Flags: flags, Extra: extra}}, nil), dir
}

// coldStartBesideSleeper asks d for b while a is loaded: a falls asleep,
// then must be evicted for b to start. It checks that the request
// succeeded, that no sleeper is left and a's process group is gone.
func coldStartBesideSleeper(t *testing.T, d *daemon) {
	t.Helper()
	a := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	d.chat("b")
	if p := d.pool("p0"); p.Profile != "b" || p.LastError != "" {
		t.Fatalf("pool %+v, want b loaded without error", p)
	}
	if s := d.sleeping("p0"); len(s) != 0 {
		t.Fatalf("sleeping %+v, want a evicted", s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(groupAlive(a.Engine.PID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := groupAlive(a.Engine.PID); len(left) > 0 {
		t.Fatalf("a's group still has %v", left)
	}
}

// Item 2: with GPU telemetry (here the simulated GPUs, --gpu-sim-dir),
// poold applies vLLM's rule per GPU before a cold start and evicts the
// sleeper whose residue would make vLLM refuse it.
func TestColdStartBesideSleeperEvictsIt(t *testing.T) {
	tag := t.Name()
	profiles, dir := memorySleepers(t, tag)
	d := startPoold(t, tag, profiles, "--gpu-sim-dir", dir)
	coldStartBesideSleeper(t, d)
	if len(d.logLines("engine found too little free GPU memory")) != 0 {
		t.Fatal("b's start failed first: the sleeper was not evicted before it")
	}
	if len(d.logLines("stopping sleeping engine")) != 1 {
		t.Fatalf("log: %d sleepers stopped, want 1", len(d.logLines("stopping sleeping engine")))
	}
}

// Item 2, without telemetry: vLLM's refusal ("Free memory on device … is
// less than desired GPU memory utilization") makes poold evict a sleeper
// and start the engine once more.
func TestStartRefusedForMemoryEvictsAndRetries(t *testing.T) {
	tag := t.Name()
	profiles, _ := memorySleepers(t, tag)
	d := startPoold(t, tag, profiles)
	coldStartBesideSleeper(t, d)
	if len(d.logLines("engine found too little free GPU memory")) != 1 {
		t.Fatal("no retry after vLLM refused the start for memory")
	}
}

// Item 4: vLLM closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE
// seconds (here 2, set in the profiles' environment); poold closes its idle
// connections to the engine sooner, so that between requests further apart
// than that the engine never closes one first (a request on such a
// connection would fail, or at best be sent again), while requests close
// together still share one. The same holds for what poold asks the engine
// itself: its models, for GET /v1/models/{id}, and its metrics, passed
// through on GET /pools/{pool}/metrics.
func TestEngineKeepAliveIsRespected(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m"}}, map[string]any{"env": map[string]string{"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "2"}}))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for _, gap := range []time.Duration{0, 100 * time.Millisecond, 2500 * time.Millisecond, 2500 * time.Millisecond} {
		time.Sleep(gap) // the idle time under test, not a wait for an event
		d.chat("m")
		for _, path := range []string{"/v1/models/m", "/pools/p0/metrics"} {
			resp, err := http.Get(d.url + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
			}
		}
	}
	if n := d.metricValue("poold_engine_connections_closed_by_engine_total"); n != 0 {
		t.Fatalf("the engine closed %v idle connections before poold did, want 0", n)
	}
}

// engineURL is the base URL of the engine loaded in pool name, to ask it
// directly what vLLM would answer.
func (d *daemon) engineURL(name string) string {
	d.t.Helper()
	p := d.pool(name)
	if p.Engine == nil {
		d.t.Fatalf("pool %s has no engine", name)
	}
	return "http://127.0.0.1:" + strconv.Itoa(p.Engine.Port)
}

// usageChunks counts a stream's usage-only chunks ("choices": [] and a
// usage object).
func usageChunks(t *testing.T, body []byte) int {
	t.Helper()
	n := 0
	for _, ev := range sseEvents(body) {
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct{}         `json:"usage"`
		}
		if ev != "[DONE]" && json.Unmarshal([]byte(ev), &chunk) == nil && chunk.Choices != nil && len(chunk.Choices) == 0 && chunk.Usage != nil {
			n++
		}
	}
	return n
}

// Item 6: in vLLM, include_usage defaults to true inside a present
// stream_options, so "stream_options": {} asks for usage. Through poold the
// client gets the usage chunk exactly as from the engine directly.
func TestEmptyStreamOptionsAskForUsage(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	body := `{"model":"m","stream":true,"stream_options":{},"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, direct := sendTo(ctx, t, d.engineURL("p0")+"/v1/chat/completions", body, nil)
	if code != http.StatusOK || usageChunks(t, direct) != 1 {
		t.Fatalf("the engine itself: %d, %d usage chunks; want 200 and 1:\n%s", code, usageChunks(t, direct), direct)
	}
	code, _, proxied := d.send(ctx, "/v1/chat/completions", body, nil)
	if code != http.StatusOK || usageChunks(t, proxied) != 1 || len(sseEvents(proxied)) != len(sseEvents(direct)) {
		t.Fatalf("through poold: %d, %d usage chunks, %d events; want 200, 1 and %d, as directly:\n%s", code, usageChunks(t, proxied), len(sseEvents(proxied)), len(sseEvents(direct)), proxied)
	}
}

// Item 7: vLLM puts prompt_logprobs and prompt_token_ids after the usage
// of a plain answer; for a long prompt they run to hundreds of KiB, and
// poold still counts the tokens (in the access log and the metrics).
func TestUsageBeforeLargeMembersIsCounted(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	body := `{"model":"m","max_tokens":2,"prompt_logprobs":1,"return_token_ids":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 3000) + `"}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, answer := d.send(ctx, "/v1/chat/completions", body, map[string]string{"X-Request-Id": "long-prompt"})
	if code != http.StatusOK {
		t.Fatalf("status %d: %.300s", code, answer)
	}
	prompt, completion := usageOf(t, answer, false)
	if after := len(answer) - strings.Index(string(answer), `"usage"`); prompt < 3000 || after < 64<<10 {
		t.Fatalf("usage %d prompt tokens with %d bytes from it to the end; want over 3000 and 64 KiB", prompt, after)
	}
	line := waitLogLine(t, d, "long-prompt")
	if line["prompt_tokens"] != float64(prompt) || line["completion_tokens"] != float64(completion) {
		t.Fatalf("access log counted %v prompt and %v completion tokens, want %d and %d: %v", line["prompt_tokens"], line["completion_tokens"], prompt, completion, line)
	}
}

// Item 7: the largest event of a stream is a setting, which the error
// event that ends a stream for it names.
func TestSSEEventLimitIsASetting(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil), "--max-sse-event-bytes", "64")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	// The stream ends with the error event, then the connection is cut.
	r := d.timedPost(context.Background(), chatBody("m", true, 3))
	events := sseEvents(r.body)
	if r.code != http.StatusOK || len(events) != 1 || !strings.Contains(events[0], "over the 64-byte limit (setting max-sse-event-bytes)") {
		t.Fatalf("status %d, events %q; want one error event naming the limit and its setting", r.code, events)
	}
}

// Item 8: current vLLM leaves the usage key out of a stream's chunks but
// the usage chunk; older versions put "usage": null in each. With either,
// poold counts the stream's tokens, withholds the usage chunk it asked for
// and passes one the client asked for.
func TestStreamChunkShapes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		flags []string
	}{
		{"no usage key", nil},
		{"usage null", []string{"--sim-usage-null"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tag := t.Name()
			d := startPoold(t, tag, profilesJSON(tag,
				[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m", Flags: tt.flags}}, nil))
			d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, ask := range []bool{false, true} {
				id := fmt.Sprintf("shape-%t", ask)
				body := chatBody("m", true, 5)
				if ask {
					body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
				}
				code, _, stream := d.send(ctx, "/v1/chat/completions", body, map[string]string{"X-Request-Id": id})
				nulls := strings.Count(string(stream), `"usage":null`)
				if code != http.StatusOK || usageChunks(t, stream) != map[bool]int{false: 0, true: 1}[ask] || (nulls > 0) != (tt.flags != nil) {
					t.Fatalf("asked for usage %t: status %d, %d usage chunks, %d null usages:\n%s", ask, code, usageChunks(t, stream), nulls, stream)
				}
				if line := waitLogLine(t, d, id); line["completion_tokens"] != float64(5) || line["prompt_tokens"] == float64(0) {
					t.Fatalf("asked for usage %t: access log %v, want 5 completion tokens and some prompt tokens", ask, line)
				}
			}
		})
	}
}

// Item 9: an engine whose core died answers /health with 503 and every
// request with 500, and, with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, never exits.
// poold polls /health while it serves, stops it, fails the pool with the
// reason, and the next request starts a fresh engine.
func TestDeadEngineCoreFailsOver(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-core-dies-after", "1500ms"}}},
		map[string]any{"env": map[string]string{"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}}),
		"--engine-health-interval", "100ms")
	first := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	failed := d.waitPool("p0", 20*time.Second, "failed over", func(p poolView) bool { return p.State == "failed" })
	if !strings.Contains(failed.LastError, `engine "m" failed over: GET /health answered 503`) {
		t.Fatalf("lastError %q, want the /health failure", failed.LastError)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(groupAlive(first.Engine.PID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if left := groupAlive(first.Engine.PID); len(left) > 0 {
		t.Fatalf("the dead engine's group still has %v", left)
	}
	d.chat("m")
	if p := d.pool("p0"); p.Engine == nil || p.Engine.PID == first.Engine.PID {
		t.Fatalf("pool %+v, want a fresh engine", p)
	}
}

// Item 10: vLLM takes an incoming X-Request-Id as its request id and, with
// --enable-request-id-headers, echoes it in its answer. poold sends its id
// (the client's, or one it made) upstream, so that the engine's log lines
// match the access log's, and answers with exactly one X-Request-Id.
func TestRequestIDReachesTheEngineOnce(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--enable-request-id-headers", "--enable-log-requests"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, client := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			sent, hdr := "", map[string]string{}
			if client {
				sent = fmt.Sprintf("client-chosen-%t", stream)
				hdr["X-Request-Id"] = sent
			}
			code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", stream, 2), hdr)
			ids := h.Values("X-Request-Id")
			if code != http.StatusOK || len(ids) != 1 || (sent != "" && ids[0] != sent) {
				t.Fatalf("sent id %q, stream %t: status %d, X-Request-Id %q; want one, %q when sent: %s", sent, stream, code, ids, sent, body)
			}
			waitLogLine(t, d, ids[0])
			deadline := time.Now().Add(10 * time.Second)
			for d.engineLog("m", "Received request chatcmpl-"+ids[0]+`"`) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the engine logged no request with id %q", ids[0])
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// vLLM answers a JSON route 400 unless the request says application/json;
// a client that sends a form's type (curl -d) or none is served all the
// same: poold read the body as JSON and tells the engine so.
func TestJSONBodyReachesTheEngineAsJSON(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ct := range []string{"application/x-www-form-urlencoded", ""} {
		for _, stream := range []bool{false, true} {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", stream, 2)))
			if err != nil {
				t.Fatal(err)
			}
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("Content-Type %q, stream %t: %d %s %v", ct, stream, resp.StatusCode, b, err)
			}
		}
	}
}

// engineLog counts the lines that profile's engines logged (through poold's
// log pump) containing text.
func (d *daemon) engineLog(profile, text string) int {
	n := 0
	for _, m := range d.engineLines(text) {
		if m["profile"] == profile {
			n++
		}
	}
	return n
}

// Item 11: vLLM serves a pooling model's routes and no completions (404).
// Woken, a sleep-enabled pooling model is warmed up through /v1/embeddings,
// which runs it, not by the 404 of a completions route it lacks.
func TestPoolingModelWakes(t *testing.T) {
	tag := t.Name()
	sleep := map[string]any{"sleep": map[string]any{"level": 1}, "weightBytes": 1000}
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "e", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{
			{ID: "e", Flags: []string{"--runner", "pooling", "--enable-sleep-mode"}, Extra: sleep},
			{ID: "g", Flags: []string{"--enable-sleep-mode"}, Extra: sleep},
		}, nil))
	d.waitPool("p0", 20*time.Second, "e ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "e" })
	embed := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if code, _, body := d.send(ctx, "/v1/embeddings", `{"model":"e","input":"hello"}`, nil); code != http.StatusOK {
			t.Fatalf("embeddings: %d %s", code, body)
		}
	}
	embed()
	d.chat("g") // e falls asleep
	embed()     // e wakes
	// The log lines may follow the answers (the engine's come through
	// poold's log pump): poll for them.
	deadline := time.Now().Add(10 * time.Second)
	for {
		woken := false
		for _, m := range d.logLines("engine ready") {
			woken = woken || m["profile"] == "e" && m["kind"] == "wake"
		}
		completions, embeddings := d.engineLog("e", `"POST /v1/completions HTTP/1.1"`), d.engineLog("e", `"POST /v1/embeddings HTTP/1.1"`)
		if woken && completions == 1 && embeddings == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("e woken %t; its engine was asked for %d completions and %d embeddings; want 1 (the warm-up's, answered 404) and 3 (two requests and the warm-up)", woken, completions, embeddings)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A route the model's kind does not serve: poold refuses it without a swap
// where the profile's flags say the kind (--runner pooling), and otherwise
// the engine's own FastAPI 404 reaches the client in poold's shape.
func TestRoutesTheModelDoesNotServe(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "e", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{{ID: "e", Flags: []string{"--runner", "pooling"}}, {ID: "g"}}, nil))
	before := d.waitPool("p0", 20*time.Second, "e ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "e" && p.Engine != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	code, _, body := d.send(ctx, "/v1/chat/completions", `{"model":"e","messages":[{"role":"user","content":"hi"}]}`, nil)
	if c, typ, msg := errorCode(t, body); code != http.StatusNotFound || c != "route_not_served" || typ != "not_found_error" || !strings.Contains(msg, "/v1/embeddings") {
		t.Fatalf("chat to a pooling model: %d %s", code, body)
	}
	if after := d.pool("p0"); after.Profile != "e" || after.SwitchingTo != "" || after.Engine == nil || after.Engine.PID != before.Engine.PID {
		t.Fatalf("the refusal touched the pool: before %+v, after %+v", before, after)
	}

	// g's flags say nothing: poold loads it, and its engine answers 404.
	code, _, body = d.send(ctx, "/v1/embeddings", `{"model":"g","input":"hi"}`, nil)
	if c, typ, _ := errorCode(t, body); code != http.StatusNotFound || c != "route_not_served" || typ != "not_found_error" {
		t.Fatalf("embeddings to a generative model: %d %s", code, body)
	}
}

// Item 12: engine output lines over 64 KiB (a 70,000-character start-up
// line; an 80 KB prompt that vLLM with --enable-log-requests logs on one
// line) are cut and marked in poold's log, and the engine lives on: poold
// keeps reading its pipe.
func TestLongEngineLogLines(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-log-line-bytes", "70000", "--enable-log-requests", "--max-model-len", "65536"}}}, nil))
	first := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	long := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 16_000) + `"}]}`
	for i, body := range []string{long, chatBody("m", false, 2), long, chatBody("m", true, 2)} {
		if code, _, answer := d.send(ctx, "/v1/chat/completions", body, nil); code != http.StatusOK {
			t.Fatalf("request %d: %d %.300s", i, code, answer)
		}
	}
	if p := d.pool("p0"); p.State != "ready" || p.Engine == nil || p.Engine.PID != first.Engine.PID {
		t.Fatalf("pool %+v, want the first engine (pid %d) still serving", p, first.Engine.PID)
	}
	// The pump reads the engine's output as it comes: poll for the lines.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cut, requests := d.engineLog("m", "[line truncated: "), d.engineLog("m", `"POST /v1/chat/completions HTTP/1.1"`)
		if cut == 3 && requests == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d truncated engine lines and %d of the 4 requests logged; want the start-up line and both prompts truncated, and every request", cut, requests)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
