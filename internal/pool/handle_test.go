package pool

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// noProcess is the handle (proc.Handle) of an engine that a test serves
// itself, with no process: it has no output and no members, and exits
// once stopped.
type noProcess struct {
	port   int
	exited chan struct{}
	once   sync.Once
}

// servedAt is the handle of an engine that a test serves on port.
func servedAt(port int) *noProcess { return &noProcess{port: port, exited: make(chan struct{})} }

func (n *noProcess) PID() int                { return 0 }
func (n *noProcess) Port() int               { return n.port }
func (n *noProcess) Exited() <-chan struct{} { return n.exited }
func (n *noProcess) Err() error              { return nil }
func (n *noProcess) Output() io.ReadCloser   { return io.NopCloser(strings.NewReader("")) }
func (n *noProcess) Seen() []string          { return nil }
func (n *noProcess) Signal(syscall.Signal) error {
	return nil
}
func (n *noProcess) Members() []int            { return nil }
func (n *noProcess) Detach() bool              { return false }
func (n *noProcess) Record() proc.LedgerEngine { return proc.LedgerEngine{Port: n.port} }

func (n *noProcess) Stop(time.Duration, <-chan struct{}, *slog.Logger) error {
	n.once.Do(func() { close(n.exited) })
	return nil
}
