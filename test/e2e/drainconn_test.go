package e2e

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A client's kept connection, idle when SIGTERM comes, still gets its next
// request answered during the drain (503 shutting_down, with Connection:
// close), not closed under it: a request sent on it at that moment would be
// reset, and a POST is not retried.
func TestDrainAnswersOnKeptConnection(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}},
		[]sim{{ID: "m", Flags: []string{"--sim-itl", "25ms"}}}, nil),
		"--shutdown-timeout", "30s")
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })

	host := strings.TrimPrefix(d.url, "http://")
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kept := bufio.NewReader(conn)
	ask := func(req string) (*http.Response, string, error) {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte(req)); err != nil {
			return nil, "", err
		}
		resp, err := http.ReadResponse(kept, nil)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, err = bufio.NewReader(resp.Body).WriteTo(&b)
		return resp, b.String(), err
	}
	if resp, body, err := ask("GET /status HTTP/1.1\r\nHost: " + host + "\r\n\r\n"); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /status on the kept connection: %v %v %.200s", resp, err, body)
	}

	started, results := d.streams(1, "m", 60, 30*time.Second)
	waitStarted(t, started, 1)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The drain has begun once a new connection's request gets its 503.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := fresh.Post(d.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, 1)))
		if err != nil {
			t.Fatalf("a request on a new connection during the drain: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 503 within 10s of SIGTERM: %d", resp.StatusCode)
		}
	}

	body := chatBody("m", false, 1)
	resp, got, err := ask("POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	if err != nil {
		t.Fatalf("a request on the connection kept from before SIGTERM was not answered: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || apiError(t, []byte(got)).Error.Code != "shutting_down" {
		t.Fatalf("on the kept connection during the drain: %d %s", resp.StatusCode, got)
	}
	if !resp.Close {
		t.Errorf("the answer during the drain keeps the connection open (Connection %q): the client would not reconnect elsewhere", resp.Header.Get("Connection"))
	}
	if r := <-results; r.err != nil || r.code != http.StatusOK {
		t.Fatalf("the stream in flight at SIGTERM: %d %v", r.code, r.err)
	}
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("poold did not exit after the drain")
	}
}
