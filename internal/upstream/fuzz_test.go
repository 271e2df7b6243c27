package upstream

import (
	"bufio"
	"bytes"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// outcome is what a client sees of one exchange.
type outcome struct {
	err     bool // the round trip failed
	status  int
	header  http.Header
	body    []byte
	bodyErr bool // reading the body failed
}

// exchangeRaw sends one POST through rt to an upstream that reads the
// request whole, answers with the raw bytes resp and resets the connection
// (a close would leave a TIME_WAIT socket per run, and thousands of runs
// would exhaust the ports); what it sent is read before the reset.
func exchangeRaw(t *testing.T, rt http.RoundTripper, resp []byte) outcome {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		c := nc.(*net.TCPConn)
		defer c.Close()
		c.SetLinger(0)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.Copy(io.Discard, req.Body)
			c.Write(resp)
		}
	}()
	defer func() { <-served }()
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/completions", nil)
	SetBody(req, []byte(`{"model":"m"}`))
	r, err := rt.RoundTrip(req)
	if err != nil {
		return outcome{err: true}
	}
	defer r.Body.Close()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	return outcome{status: r.StatusCode, header: r.Header, body: body, bodyErr: err != nil}
}

// Whatever an upstream answers, Transport shows the client what
// net/http.Transport shows it: the same failure, or the same status, headers
// and body, and the same failure reading the body. One difference is
// deliberate: a status below 100, which net/http passes on (and its server
// then panics writing), is a failure.
func FuzzTransport(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.0 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 999 Odd\r\nX: y\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok",
		"garbage\r\n\r\n",
		"",
	} {
		f.Add([]byte(s))
	}
	ours := &Transport{}
	std := &http.Transport{DisableKeepAlives: true, DisableCompression: true, MaxResponseHeaderBytes: DefaultMaxResponseHeaderBytes}
	f.Cleanup(func() { ours.Close(); std.CloseIdleConnections() })
	f.Fuzz(func(t *testing.T, resp []byte) {
		got := exchangeRaw(t, ours, resp)
		want := exchangeRaw(t, std, resp)
		ours.CloseIdleConnections()
		if !want.err && want.status < 100 {
			want = outcome{err: true}
		}
		if got.err != want.err || got.status != want.status || got.bodyErr != want.bodyErr ||
			!bytes.Equal(got.body, want.body) || !maps.EqualFunc(got.header, want.header, slices.Equal) {
			t.Fatalf("answer %q:\n Transport:      %+v\n http.Transport: %+v", resp, got, want)
		}
	})
}
