package openai

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// deadlineServer serves handler behind WriteDeadline(timeout); each
// handler's ClientStalled and write error go to results once it returns.
func deadlineServer(t *testing.T, timeout time.Duration, handler func(w http.ResponseWriter) error) (addr string, results chan deadlineResult) {
	t.Helper()
	results = make(chan deadlineResult, 4)
	srv := httptest.NewServer(WriteDeadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		err := handler(w)
		results <- deadlineResult{err: err, stalled: ClientStalled(w), took: time.Since(start)}
	}), timeout))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), results
}

type deadlineResult struct {
	err     error
	stalled bool
	took    time.Duration
}

// flood writes and flushes 64 KiB chunks until a write fails or limit
// bytes are written.
func flood(w http.ResponseWriter, limit int) error {
	chunk := []byte(strings.Repeat("x", 64<<10))
	rc := http.NewResponseController(w)
	for n := 0; n < limit; n += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			return err
		}
		if err := rc.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func await(t *testing.T, results chan deadlineResult, within time.Duration) deadlineResult {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(within):
		t.Fatalf("the handler did not return within %s", within)
		return deadlineResult{}
	}
}

// A client that sends its request and never reads: once the socket buffers
// are full, the next write fails within the timeout, and the handler knows
// the client stalled.
func TestWriteDeadlineCutsClientThatDoesNotRead(t *testing.T) {
	const timeout = 300 * time.Millisecond
	addr, results := deadlineServer(t, timeout, func(w http.ResponseWriter) error { return flood(w, 1<<30) })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r := await(t, results, 30*time.Second)
	if r.err == nil || !r.stalled {
		t.Fatalf("write error %v, stalled %v; want a deadline error and stalled", r.err, r.stalled)
	}
}

// A client that keeps reading, and an answer with pauses longer than the
// timeout between writes (an upstream's silence): nothing is cut, and the
// next request on the connection is answered although the last deadline
// has passed.
func TestWriteDeadlineKeepsReadingClient(t *testing.T) {
	const timeout = 300 * time.Millisecond
	addr, results := deadlineServer(t, timeout, func(w http.ResponseWriter) error {
		for range 3 {
			if _, err := w.Write([]byte("event\n")); err != nil {
				return err
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				return err
			}
			<-time.After(2 * timeout) // the upstream's silence under test, not a wait for an event
		}
		return flood(w, 4<<20)
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	for i := range 2 {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		buf := make([]byte, 64<<10)
		var n int64
		for {
			m, err := resp.Body.Read(buf)
			n += int64(m)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("request %d: reading after %d bytes: %v (handler: %+v)", i, n, err, <-results)
			}
		}
		r := await(t, results, 30*time.Second)
		if r.err != nil || r.stalled {
			t.Fatalf("request %d: write error %v, stalled %v; want neither", i, r.err, r.stalled)
		}
		if want := int64(3*len("event\n") + 4<<20); n != want {
			t.Fatalf("request %d: read %d bytes, want %d", i, n, want)
		}
		<-time.After(2 * timeout) // idle past the last deadline before the next request
	}
}

// Without a timeout, WriteDeadline is the handler itself.
func TestWriteDeadlineZeroIsNext(t *testing.T) {
	h := http.NotFoundHandler()
	if got := WriteDeadline(h, 0); fmt.Sprint(got) != fmt.Sprint(h) {
		t.Fatal("WriteDeadline(h, 0) wraps h")
	}
	if ClientStalled(httptest.NewRecorder()) {
		t.Fatal("ClientStalled of a writer without WriteDeadline")
	}
}
