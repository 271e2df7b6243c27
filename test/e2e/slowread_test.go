package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nonReader sends a chat request for tokens tokens to base
// (http://host:port), streamed or not, on a connection whose receive
// buffer is a few KiB, and never reads it: its answer stops leaving the
// daemon once the socket buffers are full. The connection closes at the
// test's end.
func nonReader(t *testing.T, base, model string, stream bool, tokens int) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := chatBody(model, stream, tokens)
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
}

// waitRunning polls the engine of pool p0 of d (GET /pools/p0/metrics)
// until its vllm:num_requests_running satisfies cond.
func waitRunning(t *testing.T, d *daemon, timeout time.Duration, what string, cond func(float64) bool) {
	t.Helper()
	var last float64 = -1
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, mfs := scrape(t, d.url+"/pools/p0/metrics")
		if ms := mfs["vllm:num_requests_running"].GetMetric(); len(ms) == 1 {
			last = ms[0].GetGauge().GetValue()
			if cond(last) {
				return
			}
		}
	}
	t.Fatalf("the engine's running requests: %s not reached within %s; last %v", what, timeout, last)
}

// countLines counts the lines of log holding every one of parts.
func countLines(log string, parts ...string) int {
	n := 0
	for line := range strings.Lines(log) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// slowReadProfile is one pool whose model streams as fast as it can, long
// answers allowed, at most inFlight at a time.
func slowReadProfile(tag string, inFlight int) []byte {
	return profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--max-model-len", "200000"}, Extra: map[string]any{"maxInFlight": inFlight}}}, nil)
}

// Streams whose clients never read hold every slot of a profile
// (maxInFlight 2) until client-write-timeout: then they are cut, with the
// outcome client_stalled in the access log, their slots released and the
// engine's requests cancelled, and another client, which waited for a
// slot, is served.
func TestNonReadingStreamsReleaseTheirSlots(t *testing.T) {
	const n, timeout = 2, time.Second
	tag := t.Name()
	d := startPoold(t, tag, slowReadProfile(tag, n), "--client-write-timeout", timeout.String())
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	for range n {
		nonReader(t, d.url, "m", true, 150000)
	}
	waitRunning(t, d, 20*time.Second, "both streams running", func(v float64) bool { return v == n })
	d.waitPool("p0", 5*time.Second, "every slot held", func(p poolView) bool { return p.InFlight == n })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("m", false, 2))
	took := time.Since(start)
	if err != nil || code != http.StatusOK {
		t.Fatalf("the request behind the non-readers: %d %v %s (after %s)", code, err, body, took)
	}
	t.Logf("the request behind the non-readers answered after %s (client-write-timeout %s)", took.Round(time.Millisecond), timeout)
	if took > 15*time.Second {
		t.Fatalf("answered after %s; want about the client write timeout, %s", took, timeout)
	}
	waitRunning(t, d, 10*time.Second, "the cut streams cancelled", func(v float64) bool { return v == 0 })
	d.waitPool("p0", 5*time.Second, "every slot free", func(p poolView) bool { return p.InFlight == 0 })
	for deadline := time.Now().Add(10 * time.Second); countLines(d.stdout.String(), `"outcome":"client_stalled"`, `"stream":true`) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("want %d access log lines with outcome client_stalled:\n%s", n, tail(d.stdout.String(), 10))
		}
	}
	if got := countLines(d.stderr.String(), "client stopped reading"); got != n {
		t.Fatalf("%d log lines say the client stopped reading, want %d", got, n)
	}
}

// A plain answer too large for the socket buffers (16 MiB), to a client
// that does not read it, holds its slot (maxInFlight 1) until
// client-write-timeout too: then it is cut, client_stalled, and the next
// client is served.
func TestNonReadingPlainAnswerReleasesItsSlot(t *testing.T) {
	const timeout = time.Second
	tag := t.Name()
	m := helperSim(tag, "m", "big-plain")
	m.Extra["maxInFlight"] = 1
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{m}, nil),
		"--client-write-timeout", timeout.String())
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	nonReader(t, d.url, "m", false, 2)
	d.waitPool("p0", 20*time.Second, "the slot held", func(p poolView) bool { return p.InFlight == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("m", false, 2))
	took := time.Since(start)
	if err != nil || code != http.StatusOK || len(body) < 16<<20 {
		t.Fatalf("the request behind the non-reader: %d %v, %d bytes (after %s)", code, err, len(body), took)
	}
	t.Logf("the request behind the non-reader answered after %s (client-write-timeout %s)", took.Round(time.Millisecond), timeout)
	if took > 15*time.Second {
		t.Fatalf("answered after %s; want about the client write timeout, %s", took, timeout)
	}
	for deadline := time.Now().Add(10 * time.Second); countLines(d.stdout.String(), `"outcome":"client_stalled"`, `"stream":false`) < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("want an access log line with outcome client_stalled:\n%s", tail(d.stdout.String(), 10))
		}
	}
	d.waitPool("p0", 5*time.Second, "the slot free", func(p poolView) bool { return p.InFlight == 0 })
}

// The same through fleetd, whose own client-write-timeout cuts the
// non-readers (poold's is off): the host's requests are cancelled, the
// slots on poold released, and another client served.
func TestFleetNonReadingStreamsReleaseTheirSlots(t *testing.T) {
	const n, timeout = 2, time.Second
	tag := t.Name()
	d := startPoold(t, tag, slowReadProfile(tag, n), "--client-write-timeout", "0")
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	f := startFleetd(t, []*daemon{d}, "--client-write-timeout", timeout.String())
	for range n {
		nonReader(t, f.url, "m", true, 150000)
	}
	waitRunning(t, d, 20*time.Second, "both streams running", func(v float64) bool { return v == n })
	d.waitPool("p0", 5*time.Second, "every slot held", func(p poolView) bool { return p.InFlight == n })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, host, body, err := f.post(ctx, chatBody("m", false, 2))
	took := time.Since(start)
	if err != nil || code != http.StatusOK || host != "host1" {
		t.Fatalf("the request behind the non-readers: %d from %q, %v %s (after %s)", code, host, err, body, took)
	}
	t.Logf("the request behind the non-readers answered after %s (client-write-timeout %s)", took.Round(time.Millisecond), timeout)
	if took > 15*time.Second {
		t.Fatalf("answered after %s; want about the client write timeout, %s", took, timeout)
	}
	waitRunning(t, d, 10*time.Second, "the cut streams cancelled", func(v float64) bool { return v == 0 })
	d.waitPool("p0", 5*time.Second, "every slot free", func(p poolView) bool { return p.InFlight == 0 })
	for deadline := time.Now().Add(10 * time.Second); countLines(f.stdout.String(), `"client_stalled":true`) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("want %d fleetd access log lines with client_stalled:\n%s", n, tail(f.stdout.String(), 10))
		}
	}
	if got := countLines(d.stdout.String(), `"outcome":"client_aborted"`, `"stream":true`); got != n {
		t.Fatalf("poold logged %d streams client_aborted, want %d (fleetd cancelled them)", got, n)
	}
}

// An engine that drips a byte of its stream every 100 ms without ever
// completing an event is timed out after stream-idle-timeout, as a silent
// one is: the stream ends with engine_timeout and the engine is reported
// stalled.
func TestDrippingEngineTimesOut(t *testing.T) {
	const idle = time.Second
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{helperSim(tag, "m", "drip")}, nil), "--stream-idle-timeout", idle.String())
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, _, body, err := d.post(ctx, "/v1/chat/completions", chatBody("m", true, 10))
	took := time.Since(start)
	if code != http.StatusOK || !strings.Contains(string(body), `"code":"engine_timeout"`) || !strings.Contains(string(body), "no complete event") {
		t.Fatalf("the dripping stream: %d %v, ends %q (after %s)", code, err, tail(string(body), 2), took)
	}
	t.Logf("the dripping stream ended after %s (stream-idle-timeout %s)", took.Round(time.Millisecond), idle)
	if took > 10*idle {
		t.Fatalf("the dripping stream ended after %s; want about %s", took, idle)
	}
	d.waitPool("p0", 30*time.Second, "the engine reported stalled", func(p poolView) bool { return strings.Contains(p.LastError, "stalled") })
}

// The same engine behind fleetd, with poold's own stream idle timeout off:
// fleetd's --stream-idle-timeout ends the stream with host_timeout, counts
// it as a cut, and cancels the host's request.
func TestFleetDrippingHostTimesOut(t *testing.T) {
	const idle = time.Second
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{helperSim(tag, "m", "drip")}, nil), "--stream-idle-timeout", "0")
	d.waitPool("p0", 30*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	f := startFleetd(t, []*daemon{d}, "--stream-idle-timeout", idle.String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, _, body, err := f.post(ctx, chatBody("m", true, 10))
	took := time.Since(start)
	if code != http.StatusOK || !strings.Contains(body, `"code":"host_timeout"`) || !strings.Contains(body, "no complete event") {
		t.Fatalf("the dripping stream through fleetd: %d %v, ends %q (after %s)", code, err, tail(body, 2), took)
	}
	t.Logf("the dripping stream ended after %s (fleetd's stream-idle-timeout %s)", took.Round(time.Millisecond), idle)
	if took > 10*idle {
		t.Fatalf("the dripping stream ended after %s; want about %s", took, idle)
	}
	for deadline := time.Now().Add(10 * time.Second); countLines(f.stdout.String(), `"cut":true`) < 1 || countLines(d.stdout.String(), `"outcome":"client_aborted"`) < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("want the stream cut in fleetd's access log and abandoned in poold's:\n%s\n%s", tail(f.stdout.String(), 3), tail(d.stdout.String(), 3))
		}
	}
}
