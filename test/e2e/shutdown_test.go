package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// healthCode is the status of poold's /health, or 0 when it does not answer.
func (d *daemon) healthCode() int {
	resp, err := http.Get(d.url + "/health")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// stopHurried stops poold with two SIGTERMs, the second once it drains: it
// kills its engines at once rather than waiting their stop grace.
func (d *daemon) stopHurried() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.healthCode() == http.StatusOK {
		if time.Now().After(deadline) {
			d.t.Fatal("/health did not answer 503 while poold drained")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Fatal("poold did not exit after a second SIGTERM")
	}
}

// At the end of the drain bound, a stream still running gets an error event
// (shutting_down) rather than a silent cut, and a plain request still
// waiting for its engine's answer gets a 503; both are recorded as
// shutdown_cut. While poold drains, /health answers 503.
func TestShutdownCutIsAnnounced(t *testing.T) {
	tag := t.Name()
	accessPath := filepath.Join(t.TempDir(), "access.log")
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}, {Name: "p1", GPUs: []int{1}, Default: "slow"}},
		[]sim{{ID: "m", Pools: []string{"p0"}, Flags: []string{"--sim-itl", "20ms"}},
			{ID: "slow", Pools: []string{"p1"}, Flags: []string{"--sim-ttft", "60s"}}}, nil),
		"--shutdown-timeout", "2s", "--access-log", accessPath)
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	if c := d.healthCode(); c != http.StatusOK {
		t.Fatalf("/health before the shutdown: %d", c)
	}

	started, streams := d.streams(1, "m", 3000, 60*time.Second)
	waitStarted(t, started, 1)
	type answer struct {
		code int
		id   string
		body []byte
		err  error
	}
	plain := make(chan answer, 1)
	go func() {
		code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody("slow", false, 1))
		plain <- answer{code, hdr.Get("X-Request-Id"), body, err}
	}()
	d.waitPool("p1", 10*time.Second, "the plain request in flight", func(p poolView) bool { return p.InFlight == 1 })

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.healthCode() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/health did not answer 503 while poold drained")
		}
		time.Sleep(10 * time.Millisecond)
	}

	s := <-streams
	if s.code != http.StatusOK || strings.Contains(string(s.body), "[DONE]") || !strings.Contains(string(s.body), `"code":"shutting_down"`) {
		t.Fatalf("the stream cut at the drain bound: %d, err %v, ends %q", s.code, s.err, tail(string(s.body), 3))
	}
	p := <-plain
	if p.err != nil || p.code != http.StatusServiceUnavailable || apiError(t, p.body).Error.Code != "shutting_down" {
		t.Fatalf("the plain request cut at the drain bound: %d %v %s", p.code, p.err, p.body)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("poold did not exit after the drain bound")
	}
	if d.err != nil {
		t.Fatalf("poold exit: %v", d.err)
	}
	lines := accessLines(t, accessPath)
	if l := lines[p.id]; l == nil || l["outcome"] != "shutdown_cut" || l["status"] != 503.0 {
		t.Errorf("access log of the plain request: %v", l)
	}
	cut := 0
	for _, l := range lines {
		if l["outcome"] == "shutdown_cut" {
			cut++
		}
	}
	if cut != 2 {
		t.Errorf("%d requests recorded as shutdown_cut, want 2: %v", cut, lines)
	}
}

// A second SIGTERM during the drain skips the rest of it: poold exits at
// once, says so, and leaves no engine behind.
func TestSecondSignalSkipsTheDrain(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "20ms", "--sim-ignore-sigterm"}, Extra: map[string]any{"stopTimeout": "5m"}}}, nil),
		"--shutdown-timeout", "5m")
	ready := d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	started, streams := d.streams(1, "m", 3000, 2*time.Minute)
	waitStarted(t, started, 1)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.healthCode() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/health did not answer 503 while poold drained")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sent := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("poold did not exit after a second SIGTERM")
	}
	t.Logf("exited %s after the second SIGTERM (drain bound 5m, engine stopTimeout 5m)", time.Since(sent).Round(time.Millisecond))
	if !strings.Contains(d.stderr.String(), "second signal") {
		t.Errorf("the log does not say that the drain was skipped")
	}
	if s := <-streams; !strings.Contains(string(s.body), `"code":"shutting_down"`) {
		t.Errorf("the stream cut by the second signal: err %v, ends %q", s.err, tail(string(s.body), 3))
	}
	if left := groupAlive(ready.Engine.PID); len(left) > 0 {
		t.Errorf("engine group survived: %v", left)
	}
}

// An access log whose destination blocks (a FIFO nobody reads) costs lines,
// never requests: every request is answered, the lost lines are counted, and
// /health reports the daemon degraded.
func TestBlockedAccessLogDoesNotHang(t *testing.T) {
	tag := t.Name()
	fifo := filepath.Join(t.TempDir(), "access.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A reader that never reads: poold's open succeeds, its writes block
	// once the pipe's buffer is full.
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil),
		"--access-log", fifo, "--access-log-buffer", "16KiB")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	// Far more lines than a pipe holds (64 KiB), with long request ids.
	id := strings.Repeat("x", 120)
	for i := range 600 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", false, 1)))
		req.Header.Set("X-Request-Id", fmt.Sprintf("%s-%d", id, i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("request %d with the access log blocked: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	dropped := d.metricValue("poold_access_log_dropped_lines_total")
	if dropped < 1 {
		t.Fatalf("poold_access_log_dropped_lines_total = %v, want lines dropped", dropped)
	}
	resp, err := http.Get(d.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Status  string   `json:"status"`
		Reasons []string `json:"reasons"`
	}
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || h.Status != "degraded" || len(h.Reasons) == 0 || !strings.Contains(h.Reasons[0], "access log") {
		t.Fatalf("/health with the access log dropping lines: %d %+v", resp.StatusCode, h)
	}
	t.Logf("600 requests answered; %v access-log lines dropped", dropped)
	if !strings.Contains(d.stderr.String(), "access log lines dropped") {
		t.Error("no warning about the dropped lines in the log")
	}
}

// heapRetained is the heap memory poold's Go runtime holds from the OS
// (obtained and not released), from its /metrics: unlike the RSS, it does
// not count the race detector's shadow memory.
func (d *daemon) heapRetained() int64 {
	return int64(d.metricValue("go_memstats_heap_sys_bytes") - d.metricValue("go_memstats_heap_released_bytes"))
}

// Requests that wait behind a drain hold their bodies against a host-wide
// budget: past it they get 503 queue_budget with Retry-After instead of
// growing poold's memory, and once the burst is over the memory goes back
// to the OS.
func TestQueuedBodiesAreBounded(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "1h"}}},
		[]sim{{ID: "a", Flags: []string{"--sim-itl", "20ms"}}, {ID: "b"}}, nil),
		"--queue-body-budget", "40MiB")
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	before := d.heapRetained()

	// a holds the pool (its residency is an hour) while b's requests wait.
	streamCtx, endStream := context.WithCancel(context.Background())
	defer endStream()
	started := make(chan struct{}, 1)
	go d.stream(streamCtx, "a", 3000, started)
	waitStarted(t, started, 1)

	const n, size = 8, 12 << 20
	big := fmt.Sprintf(`{"model":"b","max_tokens":1,"user":%q,"messages":[{"role":"user","content":"hi"}]}`, strings.Repeat("x", size))
	type answer struct {
		code  int
		retry string
		body  []byte
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			code, hdr, body, err := d.post(context.Background(), "/v1/chat/completions", big)
			if err != nil {
				t.Errorf("a large request: %v", err)
			}
			answers <- answer{code, hdr.Get("Retry-After"), body}
		}()
	}
	// 40 MiB hold three 12 MiB bodies: three wait, five are refused.
	refused := 0
	for range n - 3 {
		a := <-answers
		if a.code != http.StatusServiceUnavailable || a.retry == "" || apiError(t, a.body).Error.Code != "queue_budget" {
			t.Fatalf("a request past the budget: %d (Retry-After %q) %s", a.code, a.retry, a.body)
		}
		refused++
	}
	p := d.waitPool("p0", 30*time.Second, "three waiting", func(p poolView) bool { return p.Waiting["b"] == 3 })
	peak := d.heapRetained()
	t.Logf("heap held from the OS: %d MiB before, %d MiB with %d bodies waiting (%d refused)", before>>20, peak>>20, p.Waiting["b"], refused)

	// End a's stream: a is idle, b loads and serves the three.
	endStream()
	for range 3 {
		if a := <-answers; a.code != http.StatusOK {
			t.Fatalf("a waiting request: %d %s", a.code, a.body)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		held := d.heapRetained()
		if held < before+24<<20 {
			t.Logf("heap held from the OS back to %d MiB after the burst", held>>20)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("poold still holds %d MiB of heap 30 s after the burst (%d MiB before it)", held>>20, before>>20)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
