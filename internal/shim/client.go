package shim

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// Conn is a poold's attachment to a shim. Next is for one goroutine; Close
// may be called from any.
type Conn struct {
	conn net.Conn
	dec  *json.Decoder
	// Hello is the shim's hello.
	Hello Message
}

// StartError is a shim's answer that its engine could not start.
type StartError struct {
	// Status is why, as the shim found it.
	Status string
}

func (e *StartError) Error() string { return e.Status }

// Attach connects to the shim listening at path and reads its hello,
// within timeout. A shim whose engine could not start answers with why: a
// *StartError. A shim of another protocol version is an error.
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
		err = fmt.Errorf("the shim speaks protocol %d, this poold %d", m.Protocol, Protocol)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Time{})
	return &Conn{conn: c, dec: dec, Hello: m}, nil
}

// Next returns the next message: an output line (KindLine) or the engine's
// exit (KindExit, the last). An error means that the shim is gone, or that
// Close was called.
func (c *Conn) Next() (Message, error) {
	var m Message
	if err := c.dec.Decode(&m); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // a shim closes only after the exit
		}
		return Message{}, err
	}
	if m.Kind != KindLine && m.Kind != KindExit {
		return Message{}, fmt.Errorf("unexpected %q message", m.Kind)
	}
	return m, nil
}

// Close detaches from the shim; its adopt timeout starts.
func (c *Conn) Close() error { return c.conn.Close() }
