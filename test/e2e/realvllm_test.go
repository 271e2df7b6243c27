package e2e

// The real-vLLM suite: poold in front of vLLM's CPU build (scripts/install-vllm.sh)
// serving tiny models made offline (make_models.py beside this file). It runs
// only under `make test-vllm` (POOLD_VLLM_SUITE=1), after the other tests and
// never beside them: each engine takes about 45 s to start and 3.7 GB.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// realVLLM is the installed vLLM and the suite's models.
type realVLLM struct {
	python string // the virtual environment's python
	models string // the folder make_models.py wrote
}

var (
	realOnce sync.Once
	realEnv  realVLLM
	realErr  error
)

// needVLLM returns the real-vLLM environment, or skips the test outside
// `make test-vllm`. The models are made on first use, into
// $POOLD_VLLM_MODELS (by default beside the virtual environment).
func needVLLM(t *testing.T) realVLLM {
	t.Helper()
	if os.Getenv("POOLD_VLLM_SUITE") != "1" {
		t.Skip("real vLLM: run by `make test-vllm` (POOLD_VLLM_SUITE=1)")
	}
	realOnce.Do(func() {
		home := os.Getenv("POOLD_VLLM_HOME")
		if home == "" {
			realErr = fmt.Errorf("POOLD_VLLM_HOME is not set: it names the folder scripts/install-vllm.sh installed")
			return
		}
		models := os.Getenv("POOLD_VLLM_MODELS")
		if models == "" {
			models = filepath.Join(home, "models")
		}
		python := filepath.Join(home, "bin", "python")
		cmd := exec.Command(python, "make_models.py", models)
		cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_HUB_DISABLE_PROGRESS_BARS=1", "TQDM_DISABLE=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			realErr = fmt.Errorf("making the models: %w\n%s", err, out)
			return
		}
		realEnv = realVLLM{python: python, models: models}
	})
	if realErr != nil {
		t.Fatal(realErr)
	}
	return realEnv
}

// launcher is the vllm-command setting for the CPU build, whose `vllm`
// script is broken.
func (v realVLLM) launcher() string {
	return v.python + " -m vllm.entrypoints.openai.api_server"
}

// realProfile is one profile of a real engine: the model made under the
// name model, with extra fields.
type realProfile struct {
	ID, Model string
	Pools     []string
	Args      []string
	Extra     map[string]any
}

// profiles renders a profiles file of real engines, each tagged with tag in
// its environment (the leftover check finds the whole tree by it: vLLM's
// processes inherit it).
func (v realVLLM) profiles(tag string, pools []pool, profs []realProfile) []byte {
	var ps []map[string]any
	for _, p := range pools {
		m := map[string]any{"name": p.Name, "gpus": p.GPUs}
		if p.Default != "" {
			m["default"] = p.Default
		}
		for k, val := range p.Extra {
			m[k] = val
		}
		ps = append(ps, m)
	}
	var out []map[string]any
	for _, p := range profs {
		m := map[string]any{
			"id":    p.ID,
			"model": filepath.Join(v.models, p.Model),
			"args":  append([]string{"--max-model-len", "2048", "--dtype", "float32"}, p.Args...),
			"env": map[string]string{
				"POOLD_E2E_TAG":          runTag(tag),
				"VLLM_CPU_KVCACHE_SPACE": "1",
				"HF_HUB_OFFLINE":         "1",
				"VLLM_NO_USAGE_STATS":    "1",
				"DO_NOT_TRACK":           "1",
			},
		}
		if len(p.Pools) > 0 {
			m["pools"] = p.Pools
		}
		for k, val := range p.Extra {
			m[k] = val
		}
		out = append(out, m)
	}
	// Generous bounds: a start is 37-55 s on an idle 2-core machine.
	defaults := map[string]any{"startupTimeout": "5m", "stopTimeout": "20s"}
	b, _ := json.MarshalIndent(map[string]any{"pools": ps, "profiles": out, "defaults": defaults}, "", "  ")
	return b
}

// treeOf lists the live processes tagged tag and all their descendants,
// with their command lines: the API server, its resource tracker,
// VLLM::EngineCore and VLLM::Worker. The last two are found as children:
// they rename themselves (setproctitle), which overwrites their environment
// and its tag.
func treeOf(tag string) map[int]string {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	in := map[int]bool{}
	for _, pid := range taggedProcesses(tag) {
		in[pid] = true
	}
	for grew := true; grew; {
		grew = false
		for pid, pp := range parent {
			if in[pp] && !in[pid] && alive(pid) {
				in[pid], grew = true, true
			}
		}
	}
	tree := map[int]string{}
	for pid := range in {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		tree[pid] = strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
	}
	return tree
}

// reapAtCleanup stops d at the test's end and then fails the test if any
// engine process tagged tag (or a child of one) is left, killing them all.
// It runs before the harness's own leftover check, which finds only the
// tagged processes and, killing those, would leave their children running.
func reapAtCleanup(t *testing.T, d *daemon, tag string) {
	t.Cleanup(func() {
		d.stop()
		tree := treeOf(tag)
		if len(tree) == 0 {
			return
		}
		t.Errorf("engine processes left behind: %v", tree)
		for pid := range tree {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// wholeTree fails the test unless tree holds all four of a vLLM engine's
// processes.
func wholeTree(t *testing.T, tree map[int]string) {
	t.Helper()
	for _, want := range []string{"vllm.entrypoints.openai.api_server", "resource_tracker", "VLLM::EngineCore", "VLLM::Worker"} {
		found := false
		for _, name := range tree {
			found = found || strings.Contains(name, want)
		}
		if !found {
			t.Fatalf("no %s among the engine's processes: %v", want, tree)
		}
	}
}

// waitGone waits until none of pids is alive.
func waitGone(t *testing.T, what string, pids map[int]string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for pid, name := range pids {
			if alive(pid) {
				left = append(left, fmt.Sprintf("%d %s", pid, name))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still alive after %s: %v", what, timeout, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// realChat is a chat request for model of exactly n generated tokens (the
// models are random: without ignore_eos they may stop at once).
func realChat(model string, stream bool, n int, extra string) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"say something nice"}]%s}`, model, stream, n, extra)
}

// streamTokens counts a chat or completions stream's chunks with choices
// and its usage chunks, and says whether it ran to its end: a choice
// finished for its length (max_tokens, under ignore_eos), then [DONE]. It
// does not count tokens: a busy engine sends several in one chunk.
func streamTokens(t *testing.T, body []byte) (chunks, usage int, done bool) {
	t.Helper()
	finished := false
	for _, ev := range sseEvents(body) {
		if ev == "[DONE]" {
			done = finished
			continue
		}
		var c struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct{} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("stream event is not JSON: %v: %s", err, ev)
		}
		if c.Usage != nil {
			usage++
		}
		if len(c.Choices) > 0 {
			chunks++
		}
		for _, ch := range c.Choices {
			finished = finished || (ch.FinishReason != nil && *ch.FinishReason == "length")
		}
	}
	return chunks, usage, done
}

// TestRealVLLMServes checks, against real engines on one pool, every contract
// poold has with a serving vLLM: readiness, the JSON content type, usage in
// streams, the Responses and Messages APIs metered exactly, request ids, the
// engine's error shapes, its metrics, --max-num-seqs as the admission
// ceiling, keep-alive past the engine's idle close, poold's polls kept out of
// the log, a swap with a stream in flight and the old tree gone, a restart
// that adopts the engine after a drain, a SIGKILLed poold whose successor
// adopts it, and a shutdown that cuts a stream at its bound and leaves nothing.
func TestRealVLLMServes(t *testing.T) {
	v := needVLLM(t)
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	profiles := v.profiles(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "llama"}},
		[]realProfile{
			{ID: "llama", Model: "llama", Args: []string{"--max-num-seqs", "2"}},
			{ID: "qwen", Model: "qwen"},
		})
	// A CPU engine streaming on a busy 2-core machine can take seconds to
	// answer its /metrics: the scrape's bound is widened from 2 s. On an
	// idle one the tiny model streams 1,900 tokens in about a second, so
	// the engine is read five times a second, not once.
	args := append(keepArgs(state, time.Minute), "--vllm-command", v.launcher(), "--engine-metrics-timeout", "15s", "--engine-metrics-interval", "200ms")
	d := startPoold(t, tag, profiles, args...)
	reapAtCleanup(t, d, tag)
	d.waitPool("p0", 5*time.Minute, "llama ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "llama" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	t.Run("content type", func(t *testing.T) {
		// The engine refuses anything but application/json; poold sends a
		// JSON body as such whatever the client said.
		for _, ct := range []string{"", "application/x-www-form-urlencoded", "text/plain"} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(realChat("llama", false, 3, "")))
			req.Header.Del("Content-Type")
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := readAllClose(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("Content-Type %q: %d %s", ct, resp.StatusCode, b)
			}
		}
	})

	t.Run("usage", func(t *testing.T) {
		code, id, body := d.send(ctx, "/v1/chat/completions", realChat("llama", false, 7, ""), nil)
		if code != http.StatusOK {
			t.Fatalf("plain chat: %d %s", code, body)
		}
		prompt, n := usageOf(t, body, false)
		if n != 7 || prompt == 0 {
			t.Fatalf("plain chat usage %d %d, want some and 7", prompt, n)
		}
		checkLogged(t, d, id, prompt, 7)
		// A stream that did not ask gets no usage, and is counted exactly.
		code, id, body = d.send(ctx, "/v1/chat/completions", realChat("llama", true, 9, ""), nil)
		if chunks, usage, done := streamTokens(t, body); code != http.StatusOK || usage != 0 || !done || chunks == 0 {
			t.Fatalf("chat stream without include_usage: %d, %d usage chunks, %d chunks, done %t:\n%s", code, usage, chunks, done, body)
		}
		checkLogged(t, d, id, prompt, 9)
		// One that asked gets the engine's usage chunk, once.
		code, id, body = d.send(ctx, "/v1/chat/completions", realChat("llama", true, 4, `,"stream_options":{"include_usage":true}`), nil)
		if _, usage, done := streamTokens(t, body); code != http.StatusOK || usage != 1 || !done {
			t.Fatalf("chat stream with include_usage: %d, %d usage chunks:\n%s", code, usage, body)
		}
		checkLogged(t, d, id, prompt, 4)
		// Completions, plain and streamed.
		comp := func(stream bool, n int) string {
			return fmt.Sprintf(`{"model":"llama","prompt":"once upon a time","max_tokens":%d,"ignore_eos":true,"stream":%t}`, n, stream)
		}
		code, id, body = d.send(ctx, "/v1/completions", comp(false, 6), nil)
		if code != http.StatusOK {
			t.Fatalf("plain completion: %d %s", code, body)
		}
		cprompt, n := usageOf(t, body, false)
		if n != 6 {
			t.Fatalf("plain completion usage %d %d, want 6 generated", cprompt, n)
		}
		checkLogged(t, d, id, cprompt, 6)
		code, id, body = d.send(ctx, "/v1/completions", comp(true, 8), nil)
		if _, usage, done := streamTokens(t, body); code != http.StatusOK || usage != 0 || !done {
			t.Fatalf("completion stream: %d, %d usage chunks:\n%s", code, usage, body)
		}
		checkLogged(t, d, id, cprompt, 8)
	})

	t.Run("responses and messages", func(t *testing.T) {
		for _, c := range apiCalls("llama") {
			code, id, body := d.send(ctx, c.path, strings.Replace(c.body, `"model"`, `"ignore_eos":true,"model"`, 1), nil)
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", c.name, code, body)
			}
			p, n := apiUsage(t, body, c.stream)
			if p == 0 || n != 5 {
				t.Errorf("%s: the engine reported %d prompt and %d completion tokens, want some and 5", c.name, p, n)
			}
			checkLogged(t, d, id, p, n)
		}
	})

	t.Run("request id", func(t *testing.T) {
		code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", realChat("llama", false, 2, ""), map[string]string{"X-Request-Id": "real-rid-1"})
		if code != http.StatusOK || len(h.Values("X-Request-Id")) != 1 || h.Get("X-Request-Id") != "real-rid-1" {
			t.Fatalf("%d, X-Request-Id %q: %s", code, h.Values("X-Request-Id"), body)
		}
		var a struct{ ID string }
		_ = json.Unmarshal(body, &a)
		if !strings.Contains(a.ID, "real-rid-1") {
			t.Errorf("the engine's answer id %q does not carry the request id: it did not get it", a.ID)
		}
	})

	t.Run("engine errors", func(t *testing.T) {
		// A bound past the context: the engine's own 400 (its BadRequestError,
		// code 400), in poold's shape: OpenAI's type, a string code, the
		// engine's message and param.
		code, _, body := d.send(ctx, "/v1/chat/completions", realChat("llama", false, 5000, ""), nil)
		var e struct {
			Error struct {
				Message, Type string
				Param         *string
				Code          any
			}
		}
		if err := json.Unmarshal(body, &e); code != http.StatusBadRequest || err != nil || e.Error.Type != "invalid_request_error" ||
			e.Error.Code != "engine_error" || e.Error.Param == nil || e.Error.Message == "" {
			t.Errorf("max_tokens past the context: %d %s, want the engine's 400 as invalid_request_error, code engine_error, with its param", code, body)
		}
		// A model poold does not know: poold's own 404, no engine asked.
		code, _, body = d.send(ctx, "/v1/chat/completions", realChat("nope", false, 2, ""), nil)
		if c, _, _ := errorCode(t, body); code != http.StatusNotFound || c != "model_not_found" {
			t.Errorf("unknown model: %d %s", code, body)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// One stream in flight shows as running in engineStats, read from
		// the engine's own /metrics, and its KV cache as in use. The two
		// are asked of the samples apart: on a busy machine a scrape can
		// fall between the engine's updates of its gauges. Streams follow
		// one another until both were seen: on a busy machine the engine
		// can take longer to answer its /metrics than a stream lasts.
		done := make(chan []byte, 1)
		seen := make(chan struct{})
		streams := 0
		begin := time.Now()
		go func() {
			var b []byte
			for range 30 {
				_, _, b = d.send(ctx, "/v1/chat/completions", realChat("llama", true, 1900, ""), nil)
				streams++
				select {
				case <-seen:
					done <- b
					return
				default:
				}
			}
			done <- b
		}()
		deadline := time.Now().Add(time.Minute)
		var last *engineStats
		samples := map[string]bool{} // each distinct engineStats seen, for a failure's message
		for running, kv := false, false; !running || !kv; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				ended := "still running"
				select {
				case b := <-done:
					chunks, _, whole := streamTokens(t, b)
					ended = fmt.Sprintf("ended (%d chunks, ran to its end %t)", chunks, whole)
				default:
				}
				close(seen)
				t.Fatalf("engineStats never showed a stream (running seen %t, KV in use seen %t): last %+v; seen %v; %v failed scrapes; the streams began %s ago, and the last %s", running, kv, last, samples,
					d.metricValue(`poold_engine_metrics_scrape_failures_total{pool="p0"}`), time.Since(begin).Round(time.Second), ended)
			}
			for _, p := range d.status().Pools {
				last = p.EngineStats
				if last != nil {
					samples[fmt.Sprintf("running %d kv %g", last.Running, last.KVCacheUsage)] = true
				}
				running = running || (last != nil && last.Running == 1)
				kv = kv || (last != nil && last.KVCacheUsage > 0)
			}
		}
		close(seen)
		if chunks, _, ok := streamTokens(t, <-done); !ok {
			t.Errorf("the last stream measured ended early: %d chunks", chunks)
		}
		t.Logf("seen during stream %d", streams)
	})

	t.Run("max-num-seqs", func(t *testing.T) {
		// A burst of 6 at an engine that runs 2 at once: poold holds the
		// rest, so the engine never queues one and never runs more than 2.
		// How many wait depends on when a busy machine's senders get to
		// send (a late one can find a slot freed), but six answers of
		// seconds each at two a time cannot all go unqueued. The burst leaves at once, and each request is long
		// enough (seconds) that a busy machine's late sender still finds
		// the first two running.
		var wg sync.WaitGroup
		type sent struct {
			code int
			id   string
			body []byte
		}
		results := make(chan sent, 6)
		burst := make(chan struct{})
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-burst
				code, id, body := d.send(ctx, "/v1/chat/completions", realChat("llama", false, 1200, ""), nil)
				results <- sent{code, id, body}
			}()
		}
		close(burst)
		stop := make(chan struct{})
		watched := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					watched <- nil
					return
				case <-time.After(20 * time.Millisecond):
				}
				st, err := d.fetchStatus()
				if err != nil {
					watched <- err
					return
				}
				for _, p := range st.Pools {
					if p.InFlight > 2 {
						watched <- fmt.Errorf("%d requests on an engine of --max-num-seqs 2", p.InFlight)
						return
					}
					if p.EngineStats != nil && p.EngineStats.Waiting > 0 {
						watched <- fmt.Errorf("the engine queued %d requests", p.EngineStats.Waiting)
						return
					}
				}
			}
		}()
		wg.Wait()
		close(stop)
		if err := <-watched; err != nil {
			t.Error(err)
		}
		close(results)
		queued := 0
		for r := range results {
			if r.code != http.StatusOK {
				t.Errorf("a request of the burst got %d: %s; its log line %v", r.code, r.body, waitLogLine(t, d, r.id))
				continue
			}
			if ms, _ := waitLogLine(t, d, r.id)["queue_wait_ms"].(float64); ms > 0 {
				queued++
			}
		}
		if queued == 0 {
			t.Errorf("no request of the burst waited in poold's queue")
		}
	})

	t.Run("keep-alive", func(t *testing.T) {
		// The request after the engine's 5 s idle close gets a connection
		// poold has not kept past it: it is not sent on one the engine
		// closed. (Connections idle since earlier are not counted here: on a
		// machine this busy poold may read the end of an answer over a
		// second after the engine sent it, and finds a few closed first.)
		const series = "poold_engine_connections_closed_by_engine_total"
		d.chat("llama")
		time.Sleep(6 * time.Second) // past the engine's 5 s keep-alive: the idle time under test
		before := d.metricValue(series)
		d.chat("llama")
		if n := d.metricValue(series) - before; n > 0 {
			t.Errorf("the request after the idle time met %v connections the engine had closed", n)
		}
	})

	t.Run("own polls out of the log", func(t *testing.T) {
		d.waitPositive(`poold_engine_log_dropped_lines_total{pool="p0",reason="own_poll"}`, time.Minute)
		for line := range strings.Lines(d.stderr.String()) {
			if strings.Contains(line, `GET /metrics HTTP/1.1`) && !strings.Contains(line, `"level":"DEBUG"`) {
				t.Fatalf("a poll's access line logged above debug: %s", line)
			}
		}
		if !strings.Contains(d.stderr.String(), `POST /v1/chat/completions HTTP/1.1`) {
			t.Error("the clients' access lines are not kept")
		}
	})

	var llamaTree map[int]string
	t.Run("swap with a stream in flight", func(t *testing.T) {
		llamaTree = treeOf(tag)
		wholeTree(t, llamaTree)
		stream := make(chan []byte, 1)
		started := make(chan struct{})
		go func() {
			stream <- streamFirst(ctx, t, d.url+"/v1/chat/completions", realChat("llama", true, 1800, ""), started)
		}()
		<-started
		code, _, body := d.send(ctx, "/v1/chat/completions", realChat("qwen", false, 3, ""), nil)
		if code != http.StatusOK {
			t.Fatalf("the swap's own request: %d %s", code, body)
		}
		if chunks, _, done := streamTokens(t, <-stream); !done {
			t.Errorf("the llama stream was cut by the swap: %d chunks, done %t", chunks, done)
		}
		waitGone(t, "llama's tree after the swap", llamaTree, 30*time.Second)
		if p := d.pool("p0"); p.Profile != "qwen" {
			t.Fatalf("after the swap: %+v", p)
		}
	})

	t.Run("restart adopts after a drain", func(t *testing.T) {
		pid := d.serving("p0", "qwen")
		tree := treeOf(tag)
		stream := make(chan []byte, 1)
		started := make(chan struct{})
		go func() {
			stream <- streamFirst(ctx, t, d.url+"/v1/chat/completions", realChat("qwen", true, 1800, ""), started)
		}()
		<-started
		d.stop() // SIGTERM: the stream runs to its end, the engine stays
		if chunks, _, done := streamTokens(t, <-stream); !done {
			t.Errorf("the stream in flight at SIGTERM: %d chunks, done %t", chunks, done)
		}
		for p, name := range tree {
			if !alive(p) {
				t.Fatalf("%d %s gone with poold, want the engine kept", p, name)
			}
		}
		d2 := startPoold(t, tag, profiles, args...)
		reapAtCleanup(t, d2, tag)
		if got := d2.serving("p0", "qwen"); got != pid {
			t.Fatalf("the restarted poold serves pid %d, want the adopted %d", got, pid)
		}
		d2.chat("qwen")
		if n := d2.engineStarts(); n != 0 {
			t.Errorf("%d engines started by the restarted poold", n)
		}
		// SIGKILLed: the engine stays; the next poold adopts it again.
		if err := d2.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-d2.exited
		// Its SIGTERM, with a stream longer than its 0.1 s drain bound: the
		// stream is cut with poold's error event; the engine it keeps is
		// then stopped, whole, by `poold stop-engines`. The tiny model
		// streams 1,800 tokens in about half a second, and on a busy
		// machine the test may read the first event late: a stream that
		// ran to its end was not in flight at the bound. Then the next
		// poold adopts the engine and the stream is tried again, six
		// times at most.
		const attempts = 6
		for attempt := 1; ; attempt++ {
			d3 := startPoold(t, tag, profiles, append(slices.Clone(args), "--shutdown-timeout", "100ms")...)
			reapAtCleanup(t, d3, tag)
			if got := d3.serving("p0", "qwen"); got != pid {
				t.Fatalf("after a SIGKILL or a drain the next poold serves pid %d, want the adopted %d", got, pid)
			}
			started = make(chan struct{})
			go func() {
				stream <- streamFirst(ctx, t, d3.url+"/v1/chat/completions", realChat("qwen", true, 1800, `,"stream_options":{"include_usage":false}`), started)
			}()
			<-started
			d3.stop()
			body := <-stream
			if strings.Contains(string(body), "shutting_down") {
				break
			}
			chunks, _, done := streamTokens(t, body)
			if !done || attempt == attempts {
				t.Errorf("a stream cut at the drain bound does not say so: %d chunks, ran to its end %t, %d bytes, ending %q", chunks, done, len(body), tail(string(body), 6))
				break
			}
			t.Logf("attempt %d: the stream ran to its end before the drain bound; once more", attempt)
		}
		stopEngines(t, state, tag)
		waitGone(t, "the tree after stop-engines", tree, 30*time.Second)
	})
}

// streamFirst posts body to url, closes started at the first event, and
// returns the whole stream.
func streamFirst(ctx context.Context, t *testing.T, url, body string, started chan struct{}) []byte {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		close(started)
		return nil
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		close(started)
		return []byte(err.Error())
	}
	defer resp.Body.Close()
	var out []byte
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	first := true
	for sc.Scan() {
		out = append(append(out, sc.Bytes()...), '\n')
		if first && strings.HasPrefix(sc.Text(), "data: ") {
			first = false
			close(started)
		}
	}
	if first {
		close(started)
	}
	return out
}

// readAllClose reads and closes resp's body.
func readAllClose(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return []byte(b.String())
}

// engineGone returns a channel that gets nil once pool has served on an
// engine and that engine is gone (the pool has none, or another), or an
// error when ctx ends or 10 minutes pass first.
func (d *daemon) engineGone(ctx context.Context, pool string) <-chan error {
	gone := make(chan error, 1)
	go func() {
		pid := 0
		deadline := time.Now().Add(10 * time.Minute) // four engines starting at once on two cores
		for time.Now().Before(deadline) && ctx.Err() == nil {
			st, err := d.fetchStatus()
			if err != nil {
				gone <- err
				return
			}
			for _, p := range st.Pools {
				switch {
				case p.Name != pool:
				case p.State == "ready" && p.Engine != nil:
					pid = p.Engine.PID
				case pid != 0:
					gone <- nil
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		gone <- fmt.Errorf("pool %s: no engine served and went within 10m", pool)
	}()
	return gone
}

// waitPositive polls /metrics until series is above zero.
func (d *daemon) waitPositive(series string, timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for d.metricValue(series) <= 0 {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s not above zero within %s", series, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRealVLLMStartFailures checks how real engines that cannot serve are
// reported: a flag vLLM refuses and sleep mode on a CPU, each with the
// engine's own lines; a taken port, recognised and retried on another; a
// model that dies at its first request, held failing after two deaths with
// its reason. The last engine then serves, and poold is SIGKILLed: `poold
// stop-engines` stops the whole tree.
func TestRealVLLMStartFailures(t *testing.T) {
	v := needVLLM(t)
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	marker := filepath.Join(t.TempDir(), "first-start")
	// The first start of "clash" finds its port taken; the next gets poold's.
	clash := []string{"/bin/sh", "-c", `if [ ! -e "$0" ]; then : >"$0"; exec "$@" --port ` + port + `; fi; exec "$@"`, marker,
		v.python, "-m", "vllm.entrypoints.openai.api_server", "--model", filepath.Join(v.models, "llama"),
		"--host", "127.0.0.1", "--port", "{port}", "--served-model-name", "{id}", "--max-model-len", "2048", "--dtype", "float32"}
	profiles := v.profiles(tag,
		[]pool{{Name: "p1", GPUs: []int{1}}, {Name: "p2", GPUs: []int{2}}, {Name: "p3", GPUs: []int{3}}, {Name: "p4", GPUs: []int{4}}},
		[]realProfile{
			{ID: "badflag", Model: "llama", Pools: []string{"p1"}, Args: []string{"--no-such-flag"}},
			{ID: "sleepy", Model: "llama", Pools: []string{"p2"}, Extra: map[string]any{"sleep": map[string]any{"level": 1}}},
			{ID: "clash", Model: "llama", Pools: []string{"p3"}, Extra: map[string]any{"command": clash}},
			{ID: "head16", Model: "head16", Pools: []string{"p4"}},
		})
	d := startPoold(t, tag, profiles, "--state-dir", state, "--keep-engines-on-restart", "--vllm-command", v.launcher())
	reapAtCleanup(t, d, tag)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	type result struct {
		code int
		body []byte
	}
	ask := func(model string) <-chan result {
		ch := make(chan result, 1)
		go func() {
			code, _, body := d.send(ctx, "/v1/chat/completions", realChat(model, false, 2, ""), nil)
			ch <- result{code, body}
		}()
		return ch
	}
	badflag, sleepy, clashed, head16 := ask("badflag"), ask("sleepy"), ask("clash"), ask("head16")
	// vLLM answers head16's first request 500 and its server exits about
	// 3 s later: a request sent in between meets the same dying engine, so
	// each is sent once the engine before it has gone.
	dead := d.engineGone(ctx, "p4")

	for _, c := range []struct {
		name string
		res  <-chan result
		want string
	}{
		{"a flag vLLM refuses", badflag, "unrecognized arguments: --no-such-flag"},
		{"sleep mode on a CPU", sleepy, "Sleep mode is not supported on current platform"},
	} {
		r := <-c.res
		if r.code == http.StatusOK || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s: %d %s, want an error with the engine's line %q", c.name, r.code, r.body, c.want)
		}
	}
	if r := <-clashed; r.code != http.StatusOK {
		t.Errorf("an engine whose first port was taken: %d %s", r.code, r.body)
	} else if !strings.Contains(d.stderr.String(), "engine's port was taken; starting it on another") {
		t.Error("the taken port was not recognised in vLLM's words")
	}

	// head16 passes readiness and dies at its first request, each time.
	if r := <-head16; r.code == http.StatusOK {
		t.Fatalf("head16's first request: %d %s", r.code, r.body)
	}
	if err := <-dead; err != nil {
		t.Fatal(err)
	}
	dead = d.engineGone(ctx, "p4")
	if r := <-ask("head16"); r.code == http.StatusOK {
		t.Fatalf("head16's second request: %d %s", r.code, r.body)
	}
	if err := <-dead; err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	code, h, body := sendTo(ctx, t, d.url+"/v1/chat/completions", realChat("head16", false, 2, ""), nil)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(string(body), "head_dim=16") {
		t.Errorf("head16 after two deaths: %d Retry-After %q %s; want 503 at once with the engine's reason", code, h.Get("Retry-After"), body)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("the refusal took %s: an engine was started again", took)
	}

	// SIGKILL poold: the engine it left is stopped, whole, by stop-engines.
	tree := treeOf(tag)
	wholeTree(t, tree)
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	stopEngines(t, state, tag)
	waitGone(t, "the tree after stop-engines", tree, 30*time.Second)
}
