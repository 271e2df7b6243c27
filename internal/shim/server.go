package shim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Engine is the engine a shim supervises, its main process started.
type Engine interface {
	// Wait waits for the engine's main process to exit and returns how it
	// ended (nil: exit status 0). Serve calls it once.
	Wait() error
	// Stop ends every process of the engine under the stop contract
	// (SIGTERM, up to grace, SIGKILL) and returns once none is left, or
	// with an error naming the survivors. Serve may call it while Wait
	// waits, and again once the main process has exited, to end what it
	// left.
	Stop(grace time.Duration) error
	// Signal sends sig to every process of the engine.
	Signal(sig syscall.Signal) error
}

// Options are a shim's settings.
type Options struct {
	// AdoptTimeout is how long the engine runs on while no poold is
	// attached, from the shim's start and from each poold's going; it must
	// be positive.
	AdoptTimeout time.Duration
	// Lines is how many of the engine's last output lines are kept for the
	// next poold to attach; zero means 30.
	Lines int
	// Grace is the wait between SIGTERM and SIGKILL of the stops the shim
	// decides itself (no poold attached, the shim signalled) and of an
	// OpStop that gives none; zero sends SIGKILL at once.
	Grace time.Duration
	// Fingerprint is sent in the hello (Message.Fingerprint).
	Fingerprint string
	// Log is the shim's own log; nil discards it.
	Log *slog.Logger
}

const (
	// outputWait bounds the wait, once the engine exited, for the rest of
	// its output: a descendant that survives it may hold the pipe open.
	outputWait = time.Second
	// finalWait bounds the wait for the exit to reach the attached poold.
	finalWait = 10 * time.Second
	// queueLen bounds the messages queued for a poold; lines beyond it are
	// dropped (and counted in a line), never waited for: the engine's
	// output is read whatever poold does.
	queueLen = 1024
)

// Serve supervises eng, whose main process is pid and whose output (its
// stdout and stderr) is read from out, and serves the poolds that attach
// through ln, one at a time: a poold that attaches replaces the one
// attached. It returns, with how the engine ended, once the engine's main
// process has exited and the attached poold, if any, was told; when none
// was, it has called eng.Stop to end what the engine left. The engine is
// stopped (eng.Stop) when no poold is attached for opts.AdoptTimeout, when
// ctx ends (the shim was signalled), and when the attached poold asks
// (OpStop); it is signalled when that poold asks (OpSignal). Serve closes
// ln.
func Serve(ctx context.Context, ln net.Listener, pid int, eng Engine, out io.Reader, opts Options) error {
	if opts.Lines == 0 {
		opts.Lines = 30
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &server{pid: pid, opts: opts, log: opts.Log, gone: make(chan *peer), asked: make(chan asked), quit: make(chan struct{})}
	defer close(s.quit)
	defer ln.Close()
	lines := make(chan string, 64)
	go pump(out, lines, s.quit, s.log)
	exited := make(chan error, 1)
	go func() { exited <- eng.Wait() }()
	conns := make(chan net.Conn)
	go accept(ln, conns, s.quit, s.log)

	adopt := time.NewTimer(opts.AdoptTimeout)
	defer adopt.Stop()
	// stopped delivers the result of the stop under way; nil while none is.
	var stopped chan error
	stopping := false
	stop := func(why string, grace time.Duration) {
		if stopping {
			return
		}
		stopping = true
		ln.Close() // no poold attaches to an engine being stopped
		s.log.Warn("stopping the engine", "reason", why, "grace", grace)
		stopped = make(chan error, 1)
		go func() { stopped <- eng.Stop(grace) }()
	}
	stopEnded := func(err error) {
		stopped = nil
		if err != nil {
			s.log.Error("stopping the engine", "err", err)
		}
	}
	signalled := ctx.Done()
	for {
		select {
		case c := <-conns:
			s.attach(c)
			adopt.Stop()
		case p := <-s.gone:
			if p == s.peer {
				close(p.out) // its writer ends, and closes the connection
				s.peer = nil
				adopt.Reset(opts.AdoptTimeout)
				s.log.Info("poold detached; the engine runs on until another attaches", "adopt_timeout", opts.AdoptTimeout)
			}
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			s.add(line)
		case status := <-exited:
			s.drain(lines)
			if !s.tell(Message{Kind: KindExit, Status: statusText(status)}) && !stopping {
				// Nobody will end what the engine left (a descendant
				// holding the GPU, say): the shim does.
				stop("the engine exited while no poold was attached", opts.Grace)
			}
			if stopped != nil {
				stopEnded(<-stopped)
			}
			s.log.Info("engine exited", "status", statusText(status))
			return status
		case <-adopt.C:
			if s.peer == nil {
				stop(fmt.Sprintf("no poold attached for the adopt timeout (%s)", opts.AdoptTimeout), opts.Grace)
			}
		case <-signalled:
			signalled = nil
			stop("the shim was signalled", opts.Grace)
		case a := <-s.asked:
			if a.p != s.peer {
				continue // a poold replaced meanwhile
			}
			reply := Message{Kind: KindReply, ID: a.r.ID}
			switch a.r.Op {
			case OpStop:
				grace := a.r.Grace
				if grace < 0 {
					grace = opts.Grace
				}
				stop("poold asked", grace)
			case OpSignal:
				if err := signal(eng, a.r.Signal); err != nil {
					reply.Error = err.Error()
				}
			case OpState:
				reply.PID, reply.Running, reply.Stopping = pid, true, stopping
			default:
				reply.Error = fmt.Sprintf("unknown request %q", a.r.Op)
			}
			a.p.send(queued{reply, s.total})
		case err := <-stopped:
			stopEnded(err)
		}
	}
}

// server is Serve's state. Its fields are its loop's alone, but gone, asked
// and quit, which the peers' goroutines use.
type server struct {
	pid   int
	opts  Options
	log   *slog.Logger
	gone  chan *peer    // a peer's connection failed or was closed
	asked chan asked    // a peer's requests
	quit  chan struct{} // closed when Serve returns

	peer  *peer    // the attached poold; nil when none
	ring  []string // the last lines, oldest first
	total int      // lines read
	// seen is the number of the last line written to some poold (lines
	// count from 1); the peers' writers raise it.
	seen atomic.Int64
}

// attach makes c the attached poold, in place of any other, and sends it
// the hello.
func (s *server) attach(c net.Conn) {
	if s.peer != nil {
		close(s.peer.out) // its writer ends once the queue is written
		s.log.Info("another poold attached; the first is detached")
	}
	unseen := min(s.total-int(s.seen.Load()), len(s.ring))
	p := &peer{conn: c, out: make(chan queued, queueLen), done: make(chan struct{})}
	p.out <- queued{Message{Kind: KindHello, Protocol: Protocol, PID: s.pid, ShimPID: os.Getpid(), Fingerprint: s.opts.Fingerprint, Grace: s.opts.Grace, Backlog: append([]string(nil), s.ring...), Unseen: unseen}, s.total}
	go s.write(p)
	go s.read(p)
	s.peer = p
	if unseen > 0 {
		s.log.Info("poold attached", "unseen_lines", unseen)
	}
}

// add keeps line and sends it to the attached poold.
func (s *server) add(line string) {
	if len(s.ring) == s.opts.Lines {
		copy(s.ring, s.ring[1:])
		s.ring = s.ring[:len(s.ring)-1]
	}
	s.ring = append(s.ring, line)
	s.total++
	if s.peer != nil {
		s.peer.send(queued{Message{Kind: KindLine, Line: line}, s.total})
	}
}

// drain takes the rest of the engine's output, waiting at most outputWait
// for its end.
func (s *server) drain(lines <-chan string) {
	t := time.NewTimer(outputWait)
	defer t.Stop()
	for lines != nil {
		select {
		case line, ok := <-lines:
			if !ok {
				return
			}
			s.add(line)
		case <-t.C:
			s.log.Warn("the engine's output did not end with it: a descendant holds it open")
			return
		}
	}
}

// tell sends m, the last message, to the attached poold and waits (bounded)
// until it is written; it reports whether it was. Each of its two waits,
// for room in the queue and for the writer, has finalWait of its own: a
// poold that reads nothing loses the message and its connection, and never
// holds the shim.
func (s *server) tell(m Message) bool {
	p := s.peer
	if p == nil {
		return false
	}
	queue := time.NewTimer(finalWait)
	defer queue.Stop()
	select {
	case p.out <- queued{m, s.total}:
		close(p.out)
	case <-queue.C:
		// The queue is full and its writer blocked on the poold: closing
		// the connection ends the writer.
		s.log.Warn("poold read nothing while the engine exited; it is not told", "wait", finalWait)
		p.conn.Close()
	}
	// A write that blocks on a poold that does not read fails at the
	// deadline, and its writer ends.
	_ = p.conn.SetWriteDeadline(time.Now().Add(finalWait))
	written := time.NewTimer(finalWait + time.Second)
	defer written.Stop()
	select {
	case <-p.done:
	case <-written.C:
		p.conn.Close()
		<-p.done
	}
	return p.told.Load()
}

// asked is a request of a peer.
type asked struct {
	p *peer
	r Request
}

// read hands p's requests to the loop until its connection ends, or a
// request cannot be read, which ends it.
func (s *server) read(p *peer) {
	defer s.lost(p)
	dec := json.NewDecoder(p.conn)
	for {
		var r Request
		if err := dec.Decode(&r); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Warn("reading poold's requests; it is detached", "err", err)
			}
			return
		}
		select {
		case s.asked <- asked{p, r}:
		case <-s.quit:
			return
		}
	}
}

// signal sends the signal numbered sig to eng, which must be a signal.
func signal(eng Engine, sig int) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("no signal %d", sig)
	}
	return eng.Signal(syscall.Signal(sig))
}

// lost reports that p's connection ended.
func (s *server) lost(p *peer) {
	p.once.Do(func() {
		select {
		case s.gone <- p:
		case <-s.quit:
		}
	})
}

// queued is a message for a poold, and the number of the last line it
// brings the poold.
type queued struct {
	m    Message
	seen int
}

// peer is one attached poold.
type peer struct {
	conn    net.Conn
	out     chan queued   // to its writer; closed once the last message is queued
	done    chan struct{} // closed when its writer has ended and closed conn
	dropped atomic.Int64  // lines dropped since the last one written
	told    atomic.Bool   // the exit was written
	once    sync.Once     // guards the report of its loss
}

// send queues m without waiting: a poold that does not keep up loses lines.
func (p *peer) send(q queued) {
	select {
	case p.out <- q:
	default:
		p.dropped.Add(1)
	}
}

// write writes p's queue to its connection until the queue is closed or a
// write fails, then closes the connection.
func (s *server) write(p *peer) {
	defer s.lost(p) // last: the loop may be waiting for done
	defer close(p.done)
	defer p.conn.Close()
	for q := range p.out {
		m := q.m
		if n := p.dropped.Swap(0); n > 0 {
			if writeMessage(p.conn, Message{Kind: KindLine, Line: fmt.Sprintf("[poold engine-shim: %d lines of the engine's output dropped: poold did not read them in time]", n)}) != nil {
				return
			}
		}
		if err := writeMessage(p.conn, m); err != nil {
			return
		}
		for seen := s.seen.Load(); seen < int64(q.seen) && !s.seen.CompareAndSwap(seen, int64(q.seen)); seen = s.seen.Load() {
		}
		if m.Kind == KindExit {
			p.told.Store(true)
		}
	}
}

// writeMessage writes m as one line of JSON.
func writeMessage(w io.Writer, m Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// pump reads the engine's output lines into lines until its end (every
// writer closed the pipe), then closes lines; it stops early only when the
// shim is done.
func pump(out io.Reader, lines chan<- string, quit <-chan struct{}, log *slog.Logger) {
	defer close(lines)
	br := bufio.NewReaderSize(out, MaxLine)
	for {
		line, err := ReadLine(br)
		if line != "" || err == nil {
			select {
			case lines <- line:
			case <-quit:
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				log.Warn("reading the engine's output", "err", err)
			}
			return
		}
	}
}

// accept hands each connection on ln to conns until ln is closed.
func accept(ln net.Listener, conns chan<- net.Conn, quit <-chan struct{}, log *slog.Logger) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of file descriptors, say: try again shortly
			log.Warn("accepting a poold", "err", err)
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-quit:
				return
			}
		}
		select {
		case conns <- c:
		case <-quit:
			c.Close()
			return
		}
	}
}

// Fail answers the first poold to attach within wait that the engine could
// not start, with why, and closes ln.
func Fail(ln net.Listener, why error, wait time.Duration) error {
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case a := <-ch:
		if a.err != nil {
			return a.err
		}
		defer a.c.Close()
		_ = a.c.SetWriteDeadline(time.Now().Add(wait))
		return writeMessage(a.c, Message{Kind: KindFailed, Status: why.Error()})
	case <-t.C:
		return fmt.Errorf("no poold attached within %s", wait)
	}
}

// statusText is an exit status as a message carries it.
func statusText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
