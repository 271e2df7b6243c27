package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// ErrBodyIdle is wrapped by the error of a response body whose upstream sent
// nothing (or, under IdleByEvents, completed no event) for
// Transport.BodyIdleTimeout.
var ErrBodyIdle = errors.New("the upstream stalled")

// IdleByEvents makes body, a response body of a Transport with a
// BodyIdleTimeout, time its upstream's silence between events rather than
// between reads: the timeout runs from now and from each call of the
// returned func, which the body's reader makes when an event completes
// (openai.SSEReader.OnEvent), so that an upstream dripping bytes that
// never complete one still times out. Call it before the body's first
// Read, and the func from the goroutine that reads it. For any other body
// it returns nil.
func IdleByEvents(body io.ReadCloser) func() {
	b, ok := body.(*upBody)
	if !ok || b.t.BodyIdleTimeout <= 0 || b.c == nil {
		return nil
	}
	b.byEvents = true
	b.arm()
	return b.event
}

// upBody is a response body that returns its connection to the idle set
// once read to the end, and closes it when abandoned before.
type upBody struct {
	t    *Transport
	addr string
	c    *upConn // nil once released
	body io.ReadCloser
	stop func() bool // ends the context's hold on c
	ctx  context.Context
	keep bool // the connection may carry another request
	// maxIdle is the request's WithIdleTimeout, or zero.
	maxIdle time.Duration
	// byEvents: the BodyIdleTimeout runs between events (IdleByEvents),
	// not between reads.
	byEvents bool
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.c == nil {
		return 0, io.EOF
	}
	if b.t.BodyIdleTimeout > 0 && !b.byEvents {
		b.arm()
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.release(true)
	case err != nil:
		b.release(false)
		switch {
		case b.ctx.Err() != nil:
			err = b.ctx.Err()
		case isTimeout(err) && b.byEvents:
			err = fmt.Errorf("%w: no complete event for %s", ErrBodyIdle, b.t.BodyIdleTimeout)
		case isTimeout(err):
			err = fmt.Errorf("%w: no byte for %s", ErrBodyIdle, b.t.BodyIdleTimeout)
		}
	}
	return n, err
}

// arm gives the body's reads BodyIdleTimeout from now.
func (b *upBody) arm() {
	_ = b.c.SetReadDeadline(time.Now().Add(b.t.BodyIdleTimeout))
	if b.ctx.Err() != nil { // the cancel may have run before the line above
		_ = b.c.SetDeadline(aLongTimeAgo)
	}
}

// event restarts the idle clock of a body read by events.
func (b *upBody) event() {
	if b.c != nil {
		b.arm()
	}
}

func (b *upBody) Close() error {
	b.release(b.body == http.NoBody) // a body-less answer leaves the connection clean
	return nil
}

// release hands the connection back when the whole response was read and
// nothing (a Connection: close, a cancel) stands against reuse; otherwise
// it closes it.
func (b *upBody) release(eof bool) {
	if b.c == nil {
		return
	}
	c := b.c
	b.c = nil
	if eof && b.keep && b.stop() {
		// The body's reads left a read deadline (BodyIdleTimeout), which
		// would otherwise bound the next request's wait for its headers.
		_ = c.SetReadDeadline(time.Time{})
		c.maxIdle = b.maxIdle
		b.t.put(b.addr, c)
		return
	}
	b.stop()
	c.Close()
}

// isTimeout reports whether err is a read deadline passing.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
