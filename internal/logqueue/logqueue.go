// Package logqueue puts a bounded queue in front of a log destination, so
// that writing a log line never blocks the request that writes it: a full
// disk, a slow pipe or a FIFO nobody reads cost lines, counted, never
// latency.
package logqueue

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxBytes is the queue's bound when New is given none.
const DefaultMaxBytes = 1 << 20

// Writer is an io.Writer whose Write copies the line into a queue bounded in
// bytes and returns at once; one goroutine writes the queue to the
// destination, in order. A Write that does not fit is dropped, as is a line
// the destination refuses; both are counted (Dropped) and reported to the
// OnDrop function. Create it with New and stop it with Close.
type Writer struct {
	dst    io.Writer
	max    int
	onDrop func(err error) // see New

	mu     sync.Mutex // guards queue, bytes and closed
	ready  sync.Cond  // signalled on a new line and on Close, with mu
	queue  [][]byte
	bytes  int
	closed bool

	dropped  atomic.Uint64
	lastDrop atomic.Int64 // unix nanoseconds of the last drop; 0: none
	done     chan struct{}
}

// ErrQueueFull is the reason given to OnDrop for a line that did not fit.
var ErrQueueFull = errors.New("log queue full: the destination does not keep up")

// New starts the writer of dst with a queue of at most maxBytes (zero:
// DefaultMaxBytes). onDrop, if not nil, is called (from the goroutine that
// dropped it, without locks held) for every line lost, with why: it must
// not block.
func New(dst io.Writer, maxBytes int, onDrop func(err error)) *Writer {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	w := &Writer{dst: dst, max: maxBytes, onDrop: onDrop, done: make(chan struct{})}
	w.ready.L = &w.mu
	go w.run()
	return w
}

// Write queues a copy of p, or drops it when the queue is full. It never
// blocks on the destination and never fails.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.closed || w.bytes+len(p) > w.max {
		w.mu.Unlock()
		w.drop(ErrQueueFull)
		return len(p), nil
	}
	w.queue = append(w.queue, append([]byte(nil), p...))
	w.bytes += len(p)
	w.mu.Unlock()
	w.ready.Signal()
	return len(p), nil
}

func (w *Writer) drop(err error) {
	w.dropped.Add(1)
	w.lastDrop.Store(time.Now().UnixNano())
	if w.onDrop != nil {
		w.onDrop(err)
	}
}

// run writes the queue to the destination until Close, then what is left.
func (w *Writer) run() {
	defer close(w.done)
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.closed {
			w.ready.Wait()
		}
		lines := w.queue
		w.queue, w.bytes = nil, 0
		closed := w.closed
		w.mu.Unlock()
		for _, line := range lines {
			if _, err := w.dst.Write(line); err != nil {
				w.drop(err)
			}
		}
		if closed && len(lines) == 0 {
			return
		}
	}
}

// Dropped counts the lines lost so far.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// DroppedWithin reports whether a line was lost within the last d.
func (w *Writer) DroppedWithin(d time.Duration) bool {
	last := w.lastDrop.Load()
	return last != 0 && time.Since(time.Unix(0, last)) <= d
}

// Close stops accepting lines and waits, at most timeout, for the queue to
// reach the destination; it reports whether it did. A destination that
// blocks for good keeps its lines (and the writer's goroutine) past the
// timeout.
func (w *Writer) Close(timeout time.Duration) bool {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.ready.Signal()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return false
	}
}
