package logqueue

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the writer's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLinesArriveInOrder(t *testing.T) {
	var dst syncBuffer
	w := New(&dst, 0, nil)
	var want strings.Builder
	for i := range 1000 {
		line := fmt.Sprintf("line %d\n", i)
		want.WriteString(line)
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if !w.Close(10 * time.Second) {
		t.Fatal("Close did not flush")
	}
	if dst.String() != want.String() || w.Dropped() != 0 {
		t.Fatalf("destination holds %d bytes, want %d; %d dropped", len(dst.String()), want.Len(), w.Dropped())
	}
}

// blocking is a destination that blocks every write until release is closed.
type blocking struct {
	entered chan struct{}
	release chan struct{}
	wrote   atomic.Int64
}

func (b *blocking) Write(p []byte) (int, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	b.wrote.Add(1)
	return len(p), nil
}

// A destination that blocks costs lines, never a writer's time: Write
// returns at once, lines past the bound are dropped and counted, and Close
// gives up after its timeout.
func TestBlockedDestinationDropsLines(t *testing.T) {
	dst := &blocking{entered: make(chan struct{}, 1), release: make(chan struct{})}
	var reasons atomic.Int64
	w := New(dst, 100, func(err error) {
		if errors.Is(err, ErrQueueFull) {
			reasons.Add(1)
		}
	})
	line := []byte(strings.Repeat("x", 9) + "\n") // 10 bytes
	w.Write(line)
	<-dst.entered // the writer is stuck in the destination with the first line
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			w.Write(line)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a blocked destination")
	}
	// 10 lines of 10 bytes fit the 100-byte queue; the other 40 are dropped.
	if got := w.Dropped(); got != 40 || reasons.Load() != 40 {
		t.Fatalf("dropped %d (OnDrop told %d times), want 40", got, reasons.Load())
	}
	if !w.DroppedWithin(time.Minute) {
		t.Fatal("DroppedWithin does not see the drops")
	}
	if w.Close(50 * time.Millisecond) {
		t.Fatal("Close claims to have flushed into a blocked destination")
	}
	close(dst.release)
	// Once the destination takes lines again, the queued ones reach it.
	deadline := time.Now().Add(10 * time.Second)
	for dst.wrote.Load() != 11 {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines written after the release, want 11", dst.wrote.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

type failing struct{}

func (failing) Write(p []byte) (int, error) { return 0, errors.New("disk full") }

func TestFailingDestinationCountsLines(t *testing.T) {
	var last atomic.Value
	w := New(failing{}, 0, func(err error) { last.Store(err.Error()) })
	for range 3 {
		w.Write([]byte("line\n"))
	}
	if !w.Close(10 * time.Second) {
		t.Fatal("Close did not finish")
	}
	if w.Dropped() != 3 || last.Load() != "disk full" {
		t.Fatalf("dropped %d, last reason %v", w.Dropped(), last.Load())
	}
	if w.DroppedWithin(0) && w.DroppedWithin(-time.Hour) {
		t.Fatal("DroppedWithin ignores its window")
	}
}
