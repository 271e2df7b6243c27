package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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

// A kept connection that fails before any byte of the request was written
// is replaced once by a new one and the request sent whole; without GetBody
// the request cannot be sent again, and the error comes back as a
// *NotSentError.
func TestTransportRetriesUnsentRequest(t *testing.T) {
	var bodies atomic.Int32
	done := make(chan struct{})
	defer close(done)
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				<-done // keeps its side open: the client's check sees no close
				return
			}
			if b, _ := io.ReadAll(req.Body); string(b) == "payload" {
				bodies.Add(1)
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := &Transport{}
	defer tr.Close()
	// breakIdle shuts the write side of the one idle connection: it still
	// looks open to the reader, and the next write on it fails at once.
	breakIdle := func() {
		t.Helper()
		resp, err := post(t, tr, url, "")
		if err != nil {
			t.Fatal(err)
		}
		bodyOf(t, resp)
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, cs := range tr.idle {
			for _, c := range cs {
				c.Conn.(*net.TCPConn).CloseWrite()
			}
		}
	}
	breakIdle()
	resp, err := post(t, tr, url, "payload")
	if err != nil {
		t.Fatalf("a request whose kept connection failed before writing: %v", err)
	}
	if got := bodyOf(t, resp); got != "ok" || bodies.Load() != 1 {
		t.Fatalf("answer %q, whole bodies received %d, want 1", got, bodies.Load())
	}

	breakIdle()
	req, _ := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader("x")))
	req.ContentLength = 1
	_, err = tr.RoundTrip(req)
	if _, ok := errors.AsType[*NotSentError](err); !ok {
		t.Fatalf("a request without GetBody on a broken connection: %v, want a *NotSentError", err)
	}
}

// A request that the upstream read and then dropped unanswered (a crash, or
// a close crossing the request) is never sent again: the upstream may have
// acted on it. The error is not a *NotSentError.
func TestTransportNeverReplaysWrittenRequest(t *testing.T) {
	var received atomic.Int32
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if answer(br, c, "one") != nil {
			return
		}
		if req, err := http.ReadRequest(br); err == nil {
			io.Copy(io.Discard, req.Body)
			received.Add(1)
		}
	})
	tr := &Transport{}
	defer tr.Close()
	resp, err := post(t, tr, url, "payload")
	if err != nil {
		t.Fatal(err)
	}
	bodyOf(t, resp)
	_, err = post(t, tr, url, "payload")
	if err == nil {
		t.Fatal("a request dropped after it was read succeeded")
	}
	if _, ok := errors.AsType[*NotSentError](err); ok {
		t.Fatalf("a written request failed with a *NotSentError: %v", err)
	}
	if n := received.Load(); n != 1 {
		t.Fatalf("the upstream received the request %d times, want 1", n)
	}
}

// A failed dial is a *NotSentError.
func TestTransportDialErrorNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tr := &Transport{}
	defer tr.Close()
	_, err = post(t, tr, "http://"+addr, "x")
	if _, ok := errors.AsType[*NotSentError](err); !ok {
		t.Fatalf("dialling a closed port: %v, want a *NotSentError", err)
	}
}

// An upstream that answers before reading the whole body (an early 413) and
// closes: its answer is the response, not the write's "connection reset".
func TestTransportEarlyResponse(t *testing.T) {
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!")
		// Closing with the body unread resets the connection.
	})
	tr := &Transport{}
	defer tr.Close()
	resp, err := post(t, tr, url, strings.Repeat("x", 32<<20))
	if err != nil {
		t.Fatalf("an early 413: %v", err)
	}
	if got := bodyOf(t, resp); resp.StatusCode != http.StatusRequestEntityTooLarge || got != "too big!" {
		t.Fatalf("an early 413: %d %q", resp.StatusCode, got)
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

// A body whose upstream sends nothing for BodyIdleTimeout fails with
// ErrBodyIdle; one that keeps sending, however slowly, does not.
func TestTransportBodyIdleTimeout(t *testing.T) {
	stall := make(chan struct{})
	defer close(stall)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			if r.URL.Query().Get("stall") == "" {
				time.Sleep(20 * time.Millisecond) // slower than nothing, faster than the bound
			}
		}
		if r.URL.Query().Get("stall") != "" {
			select {
			case <-stall:
			case <-r.Context().Done():
			}
		}
	}))
	defer srv.Close()
	tr := &Transport{BodyIdleTimeout: 2 * time.Second}
	defer tr.Close()

	resp, err := post(t, tr, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := bodyOf(t, resp); !strings.Contains(got, "data: 4") {
		t.Fatalf("a slow but steady body: %q", got)
	}

	resp, err = post(t, tr, srv.URL+"/?stall=1", "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, ErrBodyIdle) || !strings.Contains(string(b), "data: 4") {
		t.Fatalf("a stalled body: read %q, err %v; want the events then ErrBodyIdle", b, err)
	}
}

// A response whose header block passes MaxResponseHeaderBytes fails with
// ErrResponseHeaderTooLarge (and its connection is not kept); one within it
// is read whole.
func TestTransportResponseHeaderLimit(t *testing.T) {
	url := rawServer(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			size, _ := strconv.Atoi(req.URL.Query().Get("size"))
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Filler: "+strings.Repeat("f", size)+"\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := &Transport{MaxResponseHeaderBytes: 4 << 10}
	defer tr.Close()
	resp, err := post(t, tr, url+"/?size=3000", "")
	if err != nil {
		t.Fatalf("a 3000-byte header under a 4 KiB bound: %v", err)
	}
	if got := bodyOf(t, resp); got != "ok" || len(resp.Header.Get("X-Filler")) != 3000 {
		t.Fatalf("body %q, header of %d bytes", got, len(resp.Header.Get("X-Filler")))
	}
	_, err = post(t, tr, url+"/?size=5000", "")
	if !errors.Is(err, ErrResponseHeaderTooLarge) {
		t.Fatalf("a 5000-byte header under a 4 KiB bound: %v", err)
	}
	// The default bound is 1 MiB.
	tr = &Transport{}
	defer tr.Close()
	if _, err := post(t, tr, url+"/?size="+strconv.Itoa(2<<20), ""); !errors.Is(err, ErrResponseHeaderTooLarge) {
		t.Fatalf("a 2 MiB header under the default bound: %v", err)
	}
}

// A kept connection carries no deadline from its last body into the next
// request: the BodyIdleTimeout bounds a body's reads, not the wait for the
// next answer's headers, which without a HeaderTimeout lasts as long as the
// request's context (fleetd's, waiting on a poold that queues or swaps).
func TestTransportKeptConnectionForgetsBodyDeadline(t *testing.T) {
	const idle = 200 * time.Millisecond
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			<-time.After(5 * idle) // headers later than the last body read's bound
		}
		io.WriteString(w, "ok")
	})
	tr := &Transport{BodyIdleTimeout: idle}
	defer tr.Close()
	for i, url := range []string{srv.URL, srv.URL + "/?slow=1"} {
		resp, err := post(t, tr, url, "")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := bodyOf(t, resp); got != "ok" {
			t.Fatalf("request %d: body %q", i, got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the first kept for the second", n)
	}
}
