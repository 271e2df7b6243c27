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
