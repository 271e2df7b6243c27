package openai

import (
	"errors"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// ClientWriteTimeoutSetting is the daemons' setting of WriteDeadline's
// timeout, named in their logs.
const ClientWriteTimeoutSetting = "client-write-timeout"

// WriteDeadline cuts the answers of clients that stop reading. Each write
// and flush of an answer next makes must be accepted by the client within
// timeout, or it fails: the server then closes the connection and cancels
// the request's context, which ends what the request holds (a lease, an
// upstream request). The deadline is set again before every write and
// flush, so it bounds how long one write waits for the client, never a
// whole answer: a stream read as it comes runs as long as it needs, and an
// upstream's silence between writes costs nothing. It is set once more when
// next returns, for the server's last flush. ClientStalled reports, from
// within next, whether a write timed out.
//
// It must wrap everything the server runs (it is the server's Handler):
// the deadline stays on the connection after an answer, and the next
// request on it starts with a fresh one. timeout ≤ 0 returns next.
func WriteDeadline(next http.Handler, timeout time.Duration) http.Handler {
	if timeout <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := &deadlineWriter{ResponseWriter: w, rc: *http.NewResponseController(w), timeout: timeout}
		d.arm()
		defer d.arm()
		next.ServeHTTP(d, r)
	})
}

// ClientStalled reports whether a write of w's answer timed out under
// WriteDeadline: the client stopped reading. w is the handler's writer, or
// one that unwraps (Unwrap() http.ResponseWriter) to it.
func ClientStalled(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case *deadlineWriter:
			return t.stalled.Load()
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// deadlineWriter is WriteDeadline's ResponseWriter. Its writes and flushes
// are made by one goroutine at a time, as a ResponseWriter's are.
type deadlineWriter struct {
	http.ResponseWriter
	rc      http.ResponseController // the server's writer's
	timeout time.Duration
	stalled atomic.Bool // a write or flush timed out; read by ClientStalled
}

// arm gives the connection's next writes timeout from now.
func (d *deadlineWriter) arm() { _ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout)) }

// check records a write error that is the deadline's.
func (d *deadlineWriter) check(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		d.stalled.Store(true)
	}
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	d.arm()
	n, err := d.ResponseWriter.Write(b)
	d.check(err)
	return n, err
}

// FlushError flushes within the deadline (http.ResponseController.Flush
// calls it).
func (d *deadlineWriter) FlushError() error {
	d.arm()
	err := d.rc.Flush()
	d.check(err)
	return err
}

// Flush implements http.Flusher for callers that assert it.
func (d *deadlineWriter) Flush() { _ = d.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
