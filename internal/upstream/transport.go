// Package upstream is the HTTP/1.1 client side of every forwarded request:
// poold's to its engines and fleetd's to its hosts. Transport keeps
// connections alive without a goroutine per connection, and BufferPool lends
// ReverseProxy small copy buffers.
package upstream

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for Transport's zero values.
const (
	DefaultDialTimeout    = 5 * time.Second
	DefaultIdleTimeout    = 90 * time.Second
	DefaultMaxIdlePerHost = 1024
	// DefaultMaxResponseHeaderBytes bounds a response's header block (and
	// any interim 1xx answers before it). net/http's Transport allows 10 MiB;
	// no engine or poold answer needs more than a few KiB.
	DefaultMaxResponseHeaderBytes = 1 << 20
)

// ErrResponseHeaderTooLarge is the error (wrapped) of a response whose
// header block exceeds the Transport's MaxResponseHeaderBytes.
var ErrResponseHeaderTooLarge = errors.New("response header block too large")

// NotSentError is the error of a request of which nothing reached the
// upstream: the dial failed, or the connection failed before the request's
// first byte was written. Such a request can be sent again, to the same
// upstream or another, without running twice; any other failure may come
// after the upstream read (and acted on) the request.
type NotSentError struct{ Err error }

func (e *NotSentError) Error() string { return e.Err.Error() }
func (e *NotSentError) Unwrap() error { return e.Err }

// earlyResponseWait bounds the read of an answer that the upstream may have
// sent before it stopped reading the request (an early 413), once writing
// the rest failed.
const earlyResponseWait = time.Second

// Transport is the http.RoundTripper of every forwarded request: plain
// HTTP/1.1 to an upstream on loopback (an engine for poold, a poold for
// fleetd), over kept-alive connections.
//
// Unlike http.Transport it makes the whole exchange on the caller's
// goroutine: it writes the request, reads the response headers and, through
// the returned body, the response, with no reader and writer goroutines per
// connection to hand each request and response over to. On a host where the
// client, the proxy and the engine share a few cores, those hand-offs (each
// a thread wake-up) cost more than the rest of the forward, and every open
// stream held two more goroutines. It does no compression, proxies, TLS or
// HTTP/2, none of which loopback forwarding needs.
//
// A response body is read and closed by one goroutine, as ReverseProxy does;
// cancelling the request's context unblocks it. A connection goes back to
// the idle set once its response body was read to the end.
//
// The zero Transport is ready to use: dials time out after
// DefaultDialTimeout, idle connections are closed after DefaultIdleTimeout
// (or sooner, as their request's context says: WithIdleTimeout),
// DefaultMaxIdlePerHost are kept per host, and response headers are awaited
// as long as the request's context allows, and may hold up to
// DefaultMaxResponseHeaderBytes.
type Transport struct {
	DialTimeout time.Duration
	// HeaderTimeout bounds the wait for the response headers once the
	// request is written; zero: none. It fails with a net.Error whose
	// Timeout() is true.
	HeaderTimeout time.Duration
	// BodyIdleTimeout bounds the wait for each read of a response body: an
	// upstream that sends nothing for that long (a stalled engine) fails the
	// body with an error wrapping ErrBodyIdle. For a body passed to
	// IdleByEvents it bounds instead the time between events, whatever
	// bytes trickle between them. Zero: no bound.
	BodyIdleTimeout time.Duration
	IdleTimeout     time.Duration
	MaxIdlePerHost  int
	// MaxResponseHeaderBytes bounds the bytes read before a response's body;
	// past it the exchange fails with ErrResponseHeaderTooLarge.
	MaxResponseHeaderBytes int64

	// upstreamClosed counts the idle connections the upstream closed
	// before the Transport did (see UpstreamClosed).
	upstreamClosed atomic.Uint64

	mu   sync.Mutex           // guards idle, sweep, sweepAt and closed
	idle map[string][]*upConn // by host:port, the most recently used last
	// sweep is the timer of the next sweep, due at sweepAt; nil while none
	// is scheduled.
	sweep   *time.Timer
	sweepAt time.Time
	// closed is set by Close: no connection is kept idle any more.
	closed bool
}

type idleKey struct{}

// WithIdleTimeout returns ctx saying that a connection which carried a
// request made with it may stay idle for at most d afterwards (and never
// longer than the Transport's IdleTimeout): the upstream's own keep-alive,
// say, less a margin, so that the Transport closes an idle connection
// before the upstream does and never sends a request on one the upstream
// is closing. d ≤ 0 keeps the Transport's IdleTimeout.
func WithIdleTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, idleKey{}, d)
}

// UpstreamClosed is how many idle connections the upstream closed before
// the Transport did: found closed when taken for a request, by the sweep,
// or (the costly case) failing a request that was then sent again on a new
// connection. It stays at zero while the idle timeouts are below the
// upstreams' keep-alive.
func (t *Transport) UpstreamClosed() uint64 { return t.upstreamClosed.Load() }

// sweepEvery is how often idle connections are checked: no goroutine watches
// them between requests, and one whose upstream went away (an engine that
// stopped) would otherwise hold its descriptor until the address is used
// again.
const sweepEvery = time.Second

// upConn is one connection to an upstream with its read buffer.
type upConn struct {
	net.Conn
	br        *bufio.Reader // reads through limitedConn
	idleSince time.Time
	// maxIdle is how long it may stay idle, from its last request's
	// context (WithIdleTimeout); zero: the Transport's IdleTimeout.
	maxIdle time.Duration
	// left is how many more bytes br may read from the connection while a
	// response's headers are read; negative: no bound (a body is read).
	left int64
}

// limitedConn is an upConn's Conn, read within the upConn's bound.
type limitedConn struct{ c *upConn }

func (l limitedConn) Read(p []byte) (int, error) {
	c := l.c
	if c.left == 0 {
		return 0, ErrResponseHeaderTooLarge
	}
	if c.left > 0 && int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	if c.left > 0 {
		c.left -= int64(n)
	}
	return n, err
}

// A long-past deadline unblocks every read and write on a connection.
var aLongTimeAgo = time.Unix(1, 0)

// writers holds the buffers requests are written through: a connection only
// needs one while writing.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}

// RoundTrip sends req and returns the response headers; the body streams
// from the connection as it is read. A kept connection that fails before any
// byte of req was written on it is replaced by a new one once, when req can
// be sent again (it has GetBody, or no body); a request that was written, in
// whole or in part, is never sent again. A failure with nothing sent (a
// failed dial among them) is a *NotSentError. An answer the upstream sent
// before it stopped reading the request (an early 413) is the response,
// although writing the request failed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		closeBody(req)
		return nil, fmt.Errorf("proxy transport: unsupported scheme %q", req.URL.Scheme)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	ctx := req.Context()
	for retried := false; ; retried = true {
		c, reused, err := t.conn(ctx, addr, retried)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.exchange(ctx, addr, c, req)
		if err == nil {
			return resp, nil
		}
		_, notSent := errors.AsType[*NotSentError](err)
		if !reused || !notSent || ctx.Err() != nil {
			return nil, err
		}
		t.upstreamClosed.Add(1) // a kept connection the upstream had closed
		if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
			return nil, err
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			req = req.Clone(ctx)
			req.Body = body
		}
	}
}

// exchange writes req on c and reads the response headers. A failure before
// any byte of req was written is a *NotSentError.
func (t *Transport) exchange(ctx context.Context, addr string, c *upConn, req *http.Request) (resp *http.Response, err error) {
	// Cancelling ctx breaks every blocked read and write on c.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(aLongTimeAgo) })
	defer func() {
		if err != nil {
			stop()
			c.Close()
			if ctx.Err() != nil {
				err = ctx.Err()
			}
		}
	}()

	bw := writers.Get().(*bufio.Writer)
	cw := &countingWriter{w: c.Conn}
	bw.Reset(cw)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	if err != nil {
		werr := fmt.Errorf("writing the request to %s: %w", addr, err)
		if cw.n == 0 {
			return nil, &NotSentError{werr}
		}
		// The upstream may have answered and stopped reading (an early 413
		// for a body too large): then its answer is the response, read
		// from what arrived before the connection broke.
		_ = c.SetReadDeadline(time.Now().Add(earlyResponseWait))
		if resp, err = t.readResponse(addr, c, req); err != nil {
			return nil, werr
		}
		_ = c.SetReadDeadline(time.Time{})
		resp.Body = &upBody{t: t, addr: addr, c: c, body: resp.Body, stop: stop, ctx: ctx}
		return resp, nil
	}

	if t.HeaderTimeout > 0 {
		_ = c.SetReadDeadline(time.Now().Add(t.HeaderTimeout))
	}
	if resp, err = t.readResponse(addr, c, req); err != nil {
		return nil, err
	}
	if t.HeaderTimeout > 0 {
		_ = c.SetReadDeadline(time.Time{})
		if ctx.Err() != nil { // the cancel may have run before the line above
			_ = c.SetDeadline(aLongTimeAgo)
		}
	}
	maxIdle, _ := ctx.Value(idleKey{}).(time.Duration)
	resp.Body = &upBody{t: t, addr: addr, c: c, body: resp.Body, stop: stop, ctx: ctx, keep: !resp.Close && !req.Close, maxIdle: maxIdle}
	return resp, nil
}

// readResponse reads the response to req from c up to its body, skipping
// interim 1xx answers, within MaxResponseHeaderBytes.
func (t *Transport) readResponse(addr string, c *upConn, req *http.Request) (*http.Response, error) {
	limit := cmp.Or(t.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes)
	c.left = limit
	defer func() { c.left = -1 }()
	for {
		resp, err := http.ReadResponse(c.br, req)
		if errors.Is(err, ErrResponseHeaderTooLarge) {
			return nil, fmt.Errorf("reading the response from %s: %w: more than %d bytes", addr, err, limit)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the response from %s: %w", addr, err)
		}
		// A status below 100 is no HTTP status: net/http's server would
		// panic writing it on.
		if resp.StatusCode < 100 {
			resp.Body.Close()
			return nil, fmt.Errorf("reading the response from %s: malformed status %d", addr, resp.StatusCode)
		}
		// An interim 1xx answer (100 Continue, 103 Early Hints) precedes the
		// real one.
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// conn returns an idle connection to addr that is still open, or dials one;
// with fresh, it always dials.
func (t *Transport) conn(ctx context.Context, addr string, fresh bool) (c *upConn, reused bool, err error) {
	now := time.Now()
	for !fresh {
		t.mu.Lock()
		cs := t.idle[addr]
		if len(cs) == 0 {
			t.mu.Unlock()
			break
		}
		c = cs[len(cs)-1]
		cs[len(cs)-1] = nil
		t.idle[addr] = cs[:len(cs)-1]
		t.mu.Unlock()
		if now.Sub(c.idleSince) < t.idleLimit(c) {
			if c.usable() {
				return c, true, nil
			}
			t.upstreamClosed.Add(1)
		}
		c.Close()
	}
	d := net.Dialer{Timeout: t.DialTimeout, KeepAlive: 30 * time.Second}
	if d.Timeout == 0 {
		d.Timeout = DefaultDialTimeout
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, &NotSentError{err}
	}
	// A 1 KiB read buffer keeps idle streams cheap; larger reads bypass it.
	c = &upConn{Conn: nc, left: -1}
	c.br = bufio.NewReaderSize(limitedConn{c}, 1<<10)
	return c, false, nil
}

// put adds c to addr's idle connections, or closes it when addr already
// keeps enough, and makes sure a sweep is scheduled.
func (t *Transport) put(addr string, c *upConn) {
	c.idleSince = time.Now()
	maxIdle := t.MaxIdlePerHost
	if maxIdle <= 0 {
		maxIdle = DefaultMaxIdlePerHost
	}
	t.mu.Lock()
	if t.idle == nil {
		t.idle = make(map[string][]*upConn)
	}
	kept := !t.closed && len(t.idle[addr]) < maxIdle
	if kept {
		t.idle[addr] = append(t.idle[addr], c)
		t.scheduleLocked(minTime(c.idleSince.Add(sweepEvery), t.expiry(c)))
	}
	t.mu.Unlock()
	if !kept {
		c.Close()
	}
}

// scheduleLocked makes sure a sweep runs by at. t.mu must be held.
func (t *Transport) scheduleLocked(at time.Time) {
	if t.sweep != nil && at.Before(t.sweepAt) && t.sweep.Stop() {
		t.sweep = nil
	}
	// A sweep that could not be stopped is about to run: it schedules the
	// next one, by every connection's expiry.
	if t.sweep == nil {
		t.sweep, t.sweepAt = time.AfterFunc(time.Until(at), t.sweepIdle), at
	}
}

// expiry is when idle connection c has been idle for its limit.
func (t *Transport) expiry(c *upConn) time.Time { return c.idleSince.Add(t.idleLimit(c)) }

// sweepIdle closes the idle connections past their idle limit and those
// idle for a while whose upstream has closed them, and schedules the next
// sweep while any remain: within sweepEvery, and by the first expiry.
func (t *Transport) sweepIdle() {
	now := time.Now()
	next := now.Add(sweepEvery)
	var gone []*upConn
	t.mu.Lock()
	for addr, cs := range t.idle {
		keep := cs[:0]
		for _, c := range cs {
			idle := now.Sub(c.idleSince)
			if idle >= t.idleLimit(c) {
				gone = append(gone, c)
				continue
			}
			// A connection used within the last moments is left alone: it is
			// checked anyway when next taken.
			if idle >= sweepEvery/4 && !c.usable() {
				t.upstreamClosed.Add(1)
				gone = append(gone, c)
				continue
			}
			next = minTime(next, t.expiry(c))
			keep = append(keep, c)
		}
		clear(cs[len(keep):])
		if len(keep) == 0 {
			delete(t.idle, addr)
		} else {
			t.idle[addr] = keep
		}
	}
	t.sweep = nil
	if len(t.idle) > 0 && !t.closed {
		t.scheduleLocked(next)
	}
	t.mu.Unlock()
	for _, c := range gone {
		c.Close()
	}
}

// Close closes every idle connection and stops the sweep; connections in use
// are closed when their response ends instead of being kept. The Transport
// can still make requests afterwards, each on a new connection.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	t.CloseIdleConnections()
}

// CloseIdleConnections closes every idle connection.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.Close()
		}
	}
}

// idleLimit is how long c may stay idle: its own limit, within IdleTimeout.
func (t *Transport) idleLimit(c *upConn) time.Duration {
	limit := t.IdleTimeout
	if limit <= 0 {
		limit = DefaultIdleTimeout
	}
	if c.maxIdle > 0 {
		limit = min(limit, c.maxIdle)
	}
	return limit
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// usable reports whether an idle connection can carry a request: nothing is
// buffered or waiting to be read, and the upstream has not closed it. It
// peeks at the socket without blocking, since no goroutine watches idle
// connections.
func (c *upConn) usable() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read yet is the one healthy answer: bytes would be a
		// stray response, zero bytes an orderly close, anything else a reset.
		open = errors.Is(rerr, syscall.EAGAIN)
		return true
	})
	return err == nil && open
}

// SetBody makes body the whole of req's body, which Transport may send again
// on a fresh connection.
func SetBody(req *http.Request, body []byte) {
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	req.Header.Del("Content-Length") // the client's, of a body before any rewrite; req.Write sends ContentLength
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
