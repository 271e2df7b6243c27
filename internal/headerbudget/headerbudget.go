// Package headerbudget bounds, host-wide, the memory that connections spend
// on request headers they have not finished sending: the bytes net/http's
// server has read of a header block it has not yet parsed to its end, which
// its parser holds (and grows) until then, before any authentication.
package headerbudget

import (
	"errors"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"
)

// DefaultMaxHeaderBytes is the daemons' default max-header-bytes, the
// largest header block one request may send (431 above): real clients send
// far less (OpenAI's SDKs under 2 KiB, browsers with cookies a few KiB;
// fleetd forwards at most what poold's 8 KiB rule for engines lets through),
// and net/http's own default of 1 MiB let each connection cost a megabyte
// before any authentication.
const DefaultMaxHeaderBytes = 64 << 10

// DefaultMaxBytes is the default bound on the header bytes that connections
// in the middle of their headers hold together.
const DefaultMaxBytes = 32 << 20

// smallBlock is the size up to which a header block counts as a real
// client's (OpenAI's SDKs send under 2 KiB, browsers with cookies a few):
// such blocks may use the whole budget, larger ones only what leaves a
// quarter of it to the small ones, so that a flood of large blocks never
// keeps the small ones out.
const smallBlock = 16 << 10

// Returning memory to the OS: once the header bytes held at once have passed
// a quarter of the budget, memory is returned freeDelay after none is held
// any more (when the flood's connections have closed and their headers are
// garbage), at most once per freeEvery.
const (
	freeDelay = time.Second
	freeEvery = 10 * time.Second
)

// errRefused is the error of a connection's read that the budget refused.
var errRefused = errors.New("header budget exhausted")

// refusal is the answer of a refused connection; like net/http's own 431, it
// is plain text, since the request is never parsed.
var refusal = func() []byte {
	const body = "503 Service Unavailable: too many request headers in progress on this host\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// refusalWriteTimeout bounds the write of the refusal to a client that does
// not read.
const refusalWriteTimeout = time.Second

// A Budget counts the header bytes that an http.Server reads from the
// connections of Listener while they are in their headers (from their
// accept, and from the end of each answer, until the server has read the
// header block: ConnState), and refuses a read that would take them past the
// bound: the connection is answered 503 and closed. Make one with New; the
// zero value is not usable.
type Budget struct {
	max      int64         // bound on the header bytes held at once
	used     atomic.Int64  // header bytes held now by connections in their headers
	high     atomic.Bool   // used has passed max/4 since memory was last returned
	lastFree atomic.Int64  // unix nanoseconds of the last return; 0: none
	freeing  atomic.Bool   // a return of memory to the OS is scheduled
	refused  atomic.Uint64 // connections refused so far
}

// New returns a budget of max bytes (positive).
func New(max int64) *Budget { return &Budget{max: max} }

// Refused is the number of connections refused so far.
func (b *Budget) Refused() uint64 { return b.refused.Load() }

// Listener wraps l so that the header bytes read from its connections count
// against b. The server that serves it must have b.ConnState as its
// ConnState hook, or a connection stays counted in its headers until closed.
func (b *Budget) Listener(l net.Listener) net.Listener { return listener{l, b} }

// ConnState is the http.Server's ConnState hook: a connection leaves its
// headers when it turns active (the server has read its header block) and
// enters the next when it turns idle; a closed or hijacked one holds nothing.
func (b *Budget) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	switch state {
	case http.StateIdle:
		c.held.CompareAndSwap(notInHeaders, 0)
	case http.StateActive, http.StateClosed, http.StateHijacked:
		if h := c.held.Swap(notInHeaders); h > 0 {
			b.release(h)
		}
	}
}

// take counts n more bytes of a header block already holding held, or
// refuses them.
func (b *Budget) take(held, n int64) bool {
	limit := b.max
	if held+n > smallBlock {
		limit -= b.max / 4
	}
	used := b.used.Add(n)
	if used > limit {
		b.used.Add(-n)
		return false
	}
	if used > b.max/4 && !b.high.Load() {
		b.high.Store(true)
	}
	return true
}

// release gives back n bytes; once none is held after a flood, memory is
// returned to the OS.
func (b *Budget) release(n int64) {
	if b.used.Add(-n) != 0 || !b.high.Load() || !b.freeing.CompareAndSwap(false, true) {
		return
	}
	delay := max(freeDelay, time.Until(time.Unix(0, b.lastFree.Load()).Add(freeEvery)))
	time.AfterFunc(delay, b.free)
}

// free returns the heap's unused memory to the OS.
func (b *Budget) free() {
	b.high.Store(false)
	b.lastFree.Store(time.Now().UnixNano())
	debug.FreeOSMemory()
	b.freeing.Store(false)
}

type listener struct {
	net.Listener
	b *Budget
}

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, b: l.b}, nil // in its headers from the start
}

// A conn's held besides a byte count: notInHeaders while the server reads
// a body or answers, refused once the conn has been answered 503 (every
// later read fails).
const (
	notInHeaders = -1
	refused      = -2
)

type conn struct {
	net.Conn
	b *Budget
	// held is the bytes of the header block being read, counted in b.used,
	// notInHeaders or refused. Reads add to it on the connection's
	// goroutine; the server's ConnState hook swaps it, from there or from
	// the goroutine closing idle connections.
	held atomic.Int64
}

func (c *conn) Read(p []byte) (int, error) {
	if c.held.Load() == refused {
		return 0, c.refusedError()
	}
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	h := c.held.Load()
	if h < 0 {
		return n, err
	}
	if !c.b.take(h, int64(n)) {
		c.refuse(h)
		return 0, c.refusedError()
	}
	if !c.held.CompareAndSwap(h, h+int64(n)) {
		c.b.release(int64(n)) // closed meanwhile: held nothing more
	}
	return n, err
}

// refuse gives back the h bytes the conn held and answers 503, once.
func (c *conn) refuse(h int64) {
	if !c.held.CompareAndSwap(h, refused) {
		return // closed meanwhile
	}
	if h > 0 {
		c.b.release(h)
	}
	c.b.refused.Add(1)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
	_, _ = c.Conn.Write(refusal)
}

// refusedError is the read error that makes the server close the
// connection without an answer of its own.
func (c *conn) refusedError() error {
	return &net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errRefused}
}
