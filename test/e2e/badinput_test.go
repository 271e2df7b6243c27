package e2e

// Hostile input beyond core_test.go's TestBadRequests: slow bodies and
// headers, header floods, floods of unknown model names, and model names
// holding path and control characters (docs/reliability.md).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawExchange sends raw bytes to addr, piece by piece with pause between
// pieces, and returns the raw answer (whatever arrived before the connection
// closed or 10 s passed).
func rawExchange(t *testing.T, addr string, pause time.Duration, pieces ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, p := range pieces {
		if i > 0 {
			time.Sleep(pause) // the trickle is the point
		}
		if _, err := io.WriteString(c, p); err != nil {
			break // the server gave up on us
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// stillServes fails the test unless d answers a good request.
func stillServes(t *testing.T, d *daemon, model string) {
	t.Helper()
	code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody(model, false, 2))
	if err != nil || code != http.StatusOK {
		t.Fatalf("poold stopped serving: %d %v %s", code, err, body)
	}
}

func TestSlowAndOversizedRequests(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}}, []sim{{ID: "m"}}, nil),
		"--read-timeout", "1s", "--read-header-timeout", "500ms", "--max-header-bytes", "4096")
	addr := strings.TrimPrefix(d.url, "http://")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	t.Run("slow-loris body", func(t *testing.T) {
		body := chatBody("m", false, 2)
		head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		pieces := []string{head}
		for _, c := range body[:12] { // a byte every 200ms: past the 1s read timeout
			pieces = append(pieces, string(c))
		}
		resp := rawExchange(t, addr, 200*time.Millisecond, pieces...)
		if !strings.HasPrefix(resp, "HTTP/1.1 408 ") || !strings.Contains(resp, `"code":"request_timeout"`) {
			t.Fatalf("slow body answered:\n%s", resp)
		}
	})
	t.Run("slow-loris headers", func(t *testing.T) {
		start := time.Now()
		resp := rawExchange(t, addr, 200*time.Millisecond, "POST /v1/chat/completions HTTP/1.1\r\n", "Host: x\r\n", "X-A: 1\r\n", "X-B: 1\r\n", "X-C: 1\r\n", "X-D: 1\r\n", "X-E: 1\r\n")
		if strings.Contains(resp, "200 OK") || time.Since(start) > 9*time.Second {
			t.Fatalf("slow headers were waited for (%s):\n%s", time.Since(start), resp)
		}
	})
	t.Run("header flood", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("m", false, 2)))
		for i := range 200 {
			req.Header.Set("X-Flood-"+strconv.Itoa(i), strings.Repeat("f", 100))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("20 KB of headers against a 4 KB limit: %d", resp.StatusCode)
		}
	})
	stillServes(t, d, "m")
}

// Thousands of distinct unknown model names: each gets a 404, and none of
// them becomes a metric label value or stays in memory.
func TestUnknownModelFlood(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil), "--access-log", os.DevNull)
	rss0 := procMemory(t, d.cmd.Process.Pid, "VmRSS")
	const n, workers = 3000, 8
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				name := fmt.Sprintf("unknown-%d-%s", i, strings.Repeat("x", 200))
				code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody(name, false, 1))
				if err != nil || code != http.StatusNotFound {
					errs <- fmt.Sprintf("%s: %d %v %s", name[:12], code, err, body)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	metrics := scrapeText(t, d)
	if strings.Contains(metrics, "unknown-") {
		t.Fatalf("an unknown model name became a label value")
	}
	if v := d.metricValue(`poold_requests_total{client="none",code_class="4xx",outcome="completed",pool="none",profile="none",stream="false"}`); v != n {
		t.Fatalf("unknown-model requests counted %v times under model \"none\", want %d", v, n)
	}
	// 3000 names of 200+ bytes are 600 KB; retaining them, or anything per
	// request, would show. 32 MiB leaves room for the GC's slack.
	if grew := procMemory(t, d.cmd.Process.Pid, "VmRSS") - rss0; grew > 32<<20 {
		t.Fatalf("RSS grew by %d MiB over %d unknown-model requests", grew>>20, n)
	}
	stillServes(t, d, "m")
}

// A model name made of path and control characters is only ever looked up:
// a 404 whose message quotes it escaped, one intact JSON access-log line, no
// label. A profile's model path is not a name either.
func TestHostileModelNames(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}}, []sim{{ID: "m"}}, nil))
	for _, name := range []string{
		"../../../../etc/passwd",
		"/models/m", // the profile's model path
		"m\n{\"level\":\"ERROR\",\"msg\":\"forged\"}",
		"m\x1b[2J\x00\r\u2028",
		`m","pool":"p9`,
	} {
		body, _ := json.Marshal(map[string]any{"model": name, "messages": []any{}})
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(string(body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e := apiError(t, b)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(e.Error.Message, strconv.Quote(name)) {
			t.Fatalf("%q: %d %s", name, resp.StatusCode, b)
		}
		line := waitLogLine(t, d, resp.Header.Get("X-Request-Id"))
		if line["model"] != name || line["pool"] != "" || line["status"] != 404.0 {
			t.Fatalf("%q: access log line %v", name, line)
		}
	}
	for _, out := range []string{d.stdout.String(), d.stderr.String()} {
		if strings.ContainsAny(out, "\x1b\x00\r") || strings.Contains(out, "\n{\"level\":\"ERROR\",\"msg\":\"forged\"}") {
			t.Fatalf("a control character or forged line reached the logs")
		}
	}
	for line := range strings.Lines(d.stdout.String()) {
		if !json.Valid([]byte(line)) {
			t.Fatalf("access log line is not one JSON object: %q", line)
		}
	}
	if m := scrapeText(t, d); strings.Contains(m, "passwd") || strings.Contains(m, "p9") {
		t.Fatalf("a hostile name reached a label")
	}
	// A pool pin made of a path is a 404 too, and nothing was started.
	code, _, body, err := d.post(context.Background(), "/pools/..%2F..%2Fetc/v1/chat/completions", chatBody("m", false, 1))
	if err != nil || code != http.StatusNotFound {
		t.Fatalf("path as pool pin: %d %v %s", code, err, body)
	}
	if p := d.pool("p0"); p.State != "empty" {
		t.Fatalf("hostile requests touched the pool: %+v", p)
	}
}

// scrapeText returns d's /metrics page.
func scrapeText(t *testing.T, d *daemon) string {
	t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// procMemory reads a memory line of pid's /proc status, in bytes: "VmRSS"
// (resident set size) or "VmHWM" (its peak).
func procMemory(t *testing.T, pid int, field string) int64 {
	t.Helper()
	key := field + ":"
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", key, rest, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}
