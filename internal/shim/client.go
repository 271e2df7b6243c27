package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// Conn is a poold's attachment to a shim. Next is for one goroutine; Stop,
// Signal, State and Close may be called from any. The shim's messages are
// read on a goroutine of the Conn's: a reply reaches its caller while Next
// is called, which takes the lines and the exit in their order.
type Conn struct {
	conn net.Conn
	// Hello is the shim's hello.
	Hello Message

	msgs   chan Message  // lines and the exit, for Next; closed when reading ends
	done   chan struct{} // closed when reading ends, err then set
	err    error         // why reading ended; valid once done is closed
	closed chan struct{} // closed by Close
	once   sync.Once     // guards the close of closed

	mu      sync.Mutex // guards the requests' writes, lastID and replies
	lastID  int
	replies map[int]chan Message // the requests awaiting their replies, by ID
}

// StartError is a shim's answer that its engine could not start.
type StartError struct {
	// Status is why, as the shim found it.
	Status string
}

func (e *StartError) Error() string { return e.Status }

// ProtocolError is the hello of a shim that speaks another protocol version
// than this poold's.
type ProtocolError struct {
	// Shim is the version the shim speaks.
	Shim int
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("the shim speaks protocol %d, this poold %d", e.Shim, Protocol)
}

// Attach connects to the shim listening at path and reads its hello,
// within timeout. A shim whose engine could not start answers with why: a
// *StartError. A shim of another protocol version is a *ProtocolError.
func Attach(path string, timeout time.Duration) (*Conn, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	dec := json.NewDecoder(c)
	var m Message
	err = dec.Decode(&m)
	switch {
	case err != nil:
		err = fmt.Errorf("reading the hello: %w", err)
	case m.Kind == KindFailed:
		err = &StartError{Status: m.Status}
	case m.Kind != KindHello:
		err = fmt.Errorf("a %q message in place of the hello", m.Kind)
	case m.Protocol != Protocol:
		err = &ProtocolError{Shim: m.Protocol}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Time{})
	sc := &Conn{conn: c, Hello: m, msgs: make(chan Message), done: make(chan struct{}), closed: make(chan struct{}), replies: make(map[int]chan Message)}
	go sc.read(dec)
	return sc, nil
}

// read reads the shim's messages until the connection ends: replies to
// their callers, the rest to Next.
func (c *Conn) read(dec *json.Decoder) {
	defer close(c.msgs)
	for {
		var m Message
		err := dec.Decode(&m)
		switch {
		case err == io.EOF:
			err = io.ErrUnexpectedEOF // a shim closes only after the exit
		case err == nil && m.Kind == KindReply:
			c.mu.Lock()
			ch := c.replies[m.ID]
			delete(c.replies, m.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- m
			}
			continue
		case err == nil && m.Kind != KindLine && m.Kind != KindExit:
			err = fmt.Errorf("unexpected %q message", m.Kind)
		}
		if err != nil {
			c.err = err
			close(c.done)
			return
		}
		select {
		case c.msgs <- m:
		case <-c.closed:
			c.err = net.ErrClosed
			close(c.done)
			return
		}
		if m.Kind == KindExit {
			c.err = errors.New("the shim reported its engine's exit")
			close(c.done)
			return
		}
	}
}

// Next returns the next message: an output line (KindLine) or the engine's
// exit (KindExit, the last). An error means that the shim is gone, or that
// Close was called.
func (c *Conn) Next() (Message, error) {
	m, ok := <-c.msgs
	if !ok {
		<-c.done
		return Message{}, c.err
	}
	return m, nil
}

// Stop asks the shim to stop its engine, SIGTERM then up to grace (negative:
// the shim's own) then SIGKILL, and returns once the stop has begun, or
// after timeout: its end is the engine's exit, which Next returns.
func (c *Conn) Stop(grace, timeout time.Duration) error {
	_, err := c.call(Request{Op: OpStop, Grace: grace}, timeout)
	return err
}

// Signal asks the shim to send sig to every process of its engine, within
// timeout.
func (c *Conn) Signal(sig syscall.Signal, timeout time.Duration) error {
	_, err := c.call(Request{Op: OpSignal, Signal: int(sig)}, timeout)
	return err
}

// State asks the shim for its engine's state, within timeout: the reply's
// PID, Running and Stopping.
func (c *Conn) State(timeout time.Duration) (Message, error) {
	return c.call(Request{Op: OpState}, timeout)
}

// call sends r, numbered, and waits up to timeout for its reply.
func (c *Conn) call(r Request, timeout time.Duration) (Message, error) {
	ch := make(chan Message, 1)
	c.mu.Lock()
	c.lastID++
	r.ID = c.lastID
	c.replies[r.ID] = ch
	b, err := json.Marshal(r)
	if err == nil {
		_ = c.conn.SetWriteDeadline(time.Now().Add(timeout))
		_, err = c.conn.Write(append(b, '\n'))
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.replies, r.ID)
		c.mu.Unlock()
	}()
	if err != nil {
		return Message{}, fmt.Errorf("asking the shim to %s: %w", r.Op, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var m Message
	select {
	case m = <-ch:
	case <-c.done:
		select {
		case m = <-ch: // the reply came before the connection ended
		default:
			return Message{}, fmt.Errorf("asking the shim to %s: %w", r.Op, c.err)
		}
	case <-t.C:
		return Message{}, fmt.Errorf("the shim did not answer %s within %s", r.Op, timeout)
	}
	if m.Error != "" {
		return m, fmt.Errorf("the shim could not %s: %s", r.Op, m.Error)
	}
	return m, nil
}

// Close detaches from the shim; its adopt timeout starts.
func (c *Conn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.conn.Close()
}
