package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an httptest server that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	return keepAliveServer(t, h, 0)
}

// keepAliveServer is a countingServer that closes connections idle for
// keepAlive (zero: never).
func keepAliveServer(t *testing.T, h http.HandlerFunc, keepAlive time.Duration) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.IdleTimeout = keepAlive
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func post(t *testing.T, tr *Transport, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	SetBody(req, []byte(body))
	return tr.RoundTrip(req)
}

func bodyOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// Answers read to the end leave their connection for the next request, with
// a known length or chunked; the request arrives whole.
func TestTransportReusesConnections(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Query().Get("chunked") != "" {
			w.Write(b[:1])
			w.(http.Flusher).Flush()
			w.Write(b[1:])
			return
		}
		w.Header().Set("Content-Length", "3")
		w.Write(b[:3])
	})
	tr := &Transport{}
	defer tr.Close()
	for i, url := range []string{srv.URL, srv.URL + "/?chunked=1", srv.URL, srv.URL + "/?chunked=1"} {
		resp, err := post(t, tr, url, "hello")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		want := "hel"
		if strings.Contains(url, "chunked") {
			want = "hello"
		}
		if got := bodyOf(t, resp); got != want {
			t.Fatalf("request %d: body %q, want %q", i, got, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 4 sequential requests, want 1", n)
	}
}

// A body closed before its end, or an answer with Connection: close, costs
// its connection; the next request dials a new one.
func TestTransportDropsUnfinishedConnections(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("close") != "" {
			w.Header().Set("Connection", "close")
		}
		w.Write([]byte(strings.Repeat("x", 1000)))
	})
	tr := &Transport{}
	defer tr.Close()
	resp, err := post(t, tr, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 10))
	resp.Body.Close() // abandoned after 10 bytes
	resp, err = post(t, tr, srv.URL+"/?close=1", "")
	if err != nil {
		t.Fatal(err)
	}
	bodyOf(t, resp)
	resp, err = post(t, tr, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	bodyOf(t, resp)
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3 (none reusable)", n)
	}
}

// rawServer accepts connections and hands each to serve with its number.
func rawServer(t *testing.T, serve func(n int, c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(n, c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// answer reads one request from br and writes a 200 with body.
func answer(br *bufio.Reader, c net.Conn, body string) error {
	req, err := http.ReadRequest(br)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, req.Body)
	_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	return err
}

// A kept connection that the upstream closes on reuse, before answering,
// is replaced once by a new one and the request sent again whole; without
// GetBody the request cannot be sent again, and the error comes back.
func TestTransportRetriesStaleConnection(t *testing.T) {
	var bodies atomic.Int32
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if n == 1 {
			if answer(br, c, "one") != nil {
				return
			}
			// The second request on this connection is read, then dropped
			// unanswered: what an upstream closing an idle connection looks
			// like when the close crosses the request.
			if req, err := http.ReadRequest(br); err == nil {
				io.Copy(io.Discard, req.Body)
			}
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		if string(b) == "payload" {
			bodies.Add(1)
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo")
	})
	tr := &Transport{}
	defer tr.Close()
	resp, err := post(t, tr, url, "payload")
	if err != nil {
		t.Fatal(err)
	}
	if got := bodyOf(t, resp); got != "one" {
		t.Fatalf("first answer %q", got)
	}
	resp, err = post(t, tr, url, "payload")
	if err != nil {
		t.Fatalf("second request on a connection closed under it: %v", err)
	}
	if got := bodyOf(t, resp); got != "two" || bodies.Load() != 1 {
		t.Fatalf("answer %q, whole bodies at the new connection %d", got, bodies.Load())
	}

	// The same, with a body that cannot be read twice.
	url2 := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if answer(br, c, "one") != nil {
			return
		}
		if req, err := http.ReadRequest(br); err == nil {
			io.Copy(io.Discard, req.Body)
		}
	})
	resp, err = post(t, tr, url2, "x")
	if err != nil {
		t.Fatal(err)
	}
	bodyOf(t, resp)
	req, _ := http.NewRequest(http.MethodPost, url2, io.NopCloser(strings.NewReader("x")))
	req.ContentLength = 1
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a request without GetBody was sent twice")
	}
}

// An upstream that closed an idle connection is noticed before the
// connection is reused: the request goes out on a new one.
func TestTransportSkipsClosedIdleConnection(t *testing.T) {
	closed := make(chan struct{})
	var conns atomic.Int32
	url := rawServer(t, func(n int, c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		if answer(br, c, "ok") != nil {
			return
		}
		if n == 1 {
			c.Close()
			close(closed)
			return
		}
		for answer(br, c, "ok") == nil {
		}
	})
	tr := &Transport{}
	defer tr.Close()
	for i := range 2 {
		resp, err := post(t, tr, url, "")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		bodyOf(t, resp)
		if i == 0 {
			<-closed
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// Cancelling the request's context ends a blocked body read at once with the
// context's error.
func TestTransportCancelUnblocksBody(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		<-release
	})
	tr := &Transport{}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("read after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancel did not unblock the body")
	}
}

// HeaderTimeout fails a slow upstream with a timeout, which is not retried;
// an interim 1xx answer is skipped.
func TestTransportHeaderTimeoutAndInterim(t *testing.T) {
	var attempts atomic.Int32
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if req.URL.Path == "/slow" {
				attempts.Add(1)
				time.Sleep(300 * time.Millisecond)
			}
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := &Transport{HeaderTimeout: 50 * time.Millisecond}
	defer tr.Close()
	resp, err := post(t, tr, url+"/fast", "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || bodyOf(t, resp) != "ok" {
		t.Fatalf("status %d after an interim answer", resp.StatusCode)
	}
	_, err = post(t, tr, url+"/slow", "")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("slow headers: %v, want a timeout", err)
	}
	if n := attempts.Load(); n != 1 {
		t.Fatalf("a timed-out request was sent %d times", n)
	}
}

func TestTransportRefusesOtherSchemes(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1:1/", nil)
	if _, err := (&Transport{}).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "unsupported scheme") {
		t.Fatalf("https: %v", err)
	}
}

// Idle connections whose upstream went away (an engine that stopped) are
// closed by the sweep, without a request to that address.
func TestTransportSweepsClosedConnections(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	tr := &Transport{}
	defer tr.Close()
	resps := make([]*http.Response, 3)
	for i := range resps { // three connections at once
		var err error
		if resps[i], err = post(t, tr, srv.URL, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, resp := range resps {
		bodyOf(t, resp)
	}
	idle := func() int {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		n := 0
		for _, cs := range tr.idle {
			n += len(cs)
		}
		return n
	}
	if n := idle(); n != 3 {
		t.Fatalf("%d idle connections, want 3", n)
	}
	srv.CloseClientConnections()
	deadline := time.Now().Add(10 * time.Second)
	for idle() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections to a closed upstream still kept", idle())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close closes the idle connections and stops the sweep; a request made
// afterwards works on a new connection, which is not kept.
func TestTransportClose(t *testing.T) {
	closed := make(chan struct{}, 4)
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed <- struct{}{}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &Transport{}
	resp, err := post(t, tr, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	bodyOf(t, resp)
	tr.mu.Lock()
	idle, sweeping := len(tr.idle[srv.Listener.Addr().String()]), tr.sweep != nil
	tr.mu.Unlock()
	if idle != 1 || !sweeping {
		t.Fatalf("before Close: %d idle connections, sweep scheduled %v; want 1, true", idle, sweeping)
	}
	tr.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection was not closed by Close")
	}
	resp, err = post(t, tr, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := bodyOf(t, resp); got != "ok" {
		t.Fatalf("after Close: body %q", got)
	}
	tr.mu.Lock()
	idle, sweeping = len(tr.idle), tr.sweep != nil
	tr.mu.Unlock()
	if idle != 0 || sweeping {
		t.Fatalf("after Close: %d idle hosts, sweep scheduled %v; want none", idle, sweeping)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}
