package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/poold/poold/internal/shim"
)

// Engines under a shim: with Supervisor.Shims, each engine is started by a
// `poold engine-shim` of its own (RunShim), in a session of its own and
// without a parent-death signal, so that it outlives poold; the shim is the
// engine's parent, and the engine dies with it. poold attaches to the shim
// over a Unix socket in the state directory and gets the engine's output
// and exit through it, and asks it, through the same connection, to stop
// or signal the engine: poold signals no process that a shim holds. A
// poold that stops detaches (Handle.Detach) instead of stopping its
// engines, and the next one adopts them (Supervisor.Adopt).

// AttachTimeout bounds an attach to the shim of a running engine, and each
// request of an adoption's checks (Shimmed.Recorded).
const AttachTimeout = 5 * time.Second

// shimRequestTimeout bounds a request to a shim, which its loop answers at
// once.
const shimRequestTimeout = 10 * time.Second

// OutputWait bounds the wait for an exited engine's last output lines: a
// descendant that survives it may hold the pipe open, and a shim sends
// them before its report of the exit.
const OutputWait = time.Second

// ErrNotRecorded is an adoption's finding that an engine's process is not
// the one recorded: it exited, or its pid is another process's now.
var ErrNotRecorded = errors.New("is gone, or is not the recorded process")

// errDetached is the exit of an engine that poold let go of, for the next
// poold to adopt: it still runs.
var errDetached = errors.New("detached: the engine runs on under its supervisor")

// Shimmed is the Handle of an engine under its shim, to which poold is
// attached.
type Shimmed struct {
	process
	path string       // the shim's socket
	conn *shim.Conn   // poold's attachment to the shim
	log  *slog.Logger // where the loss of conn is logged
	// detached is set once poold let go of the engine for the next poold
	// to adopt; lost once the connection to the shim ended without its
	// report of the exit.
	detached, lost atomic.Bool
	// seen is the output that no poold received before this one (Seen).
	seen []string
}

// startShimmed starts sp under a shim of its own, which starts it into
// the cgroup at dir in cgroup mode and stays out of it: a stop that ends
// the group never ends the shim.
func (s *Supervisor) startShimmed(sp Spec, dir string) (Handle, error) {
	path := s.Shims.socket(sp.Token)
	cmd := s.Shims.command(s.Self, path, sp.Token, shim.Fingerprint(sp.Argv, sp.Given), dir, sp.Grace, sp.Argv)
	cmd.Env = sp.Env
	c, err := s.Shims.start(cmd, path, s.Spawn)
	if err != nil {
		RemoveShimFiles(path)
		return nil, fmt.Errorf("running %q: %w", sp.Argv[0], err)
	}
	h := newShimmed(newProcess(c.Hello.PID, sp.Port, sp.Token, dir, nil), path, c, sp.Log)
	if st, err := ProcStat(h.pid); err == nil {
		h.startTicks = st.Start
	}
	return h, nil
}

// Adopt attaches to the shim of the engine that rec records, which must
// run the recorded pid, and follows the engine as one that poold started;
// log is where the loss of the connection is logged, with the pid added.
// The checks that the engine is still the recorded process
// (Shimmed.Recorded) and is as the profile in force would start it are the
// caller's.
func (s *Supervisor) Adopt(rec LedgerEngine, log *slog.Logger) (*Shimmed, error) {
	c, err := shim.Attach(rec.Shim, AttachTimeout)
	var pe *shim.ProtocolError
	switch {
	case errors.As(err, &pe):
		return nil, fmt.Errorf("its supervisor is of an older or newer poold (protocol %d; this poold speaks %d) and cannot be asked to stop it: it is stopped by its process group and loaded afresh", pe.Shim, shim.Protocol)
	case err != nil:
		return nil, fmt.Errorf("its supervisor does not answer (it ends once its engine has exited): %w", err)
	}
	if c.Hello.PID != rec.PID {
		c.Close()
		return nil, fmt.Errorf("its supervisor runs pid %d, not the recorded %d", c.Hello.PID, rec.PID)
	}
	p := newProcess(rec.PID, rec.Port, rec.Token, rec.Cgroup, nil)
	p.startTicks = rec.StartTicks
	return newShimmed(p, rec.Shim, c, log), nil
}

// newShimmed follows the engine p under the shim at path, attached as c:
// its output as the shim sends it, and its exit (follow).
func newShimmed(p process, path string, c *shim.Conn, log *slog.Logger) *Shimmed {
	h := &Shimmed{process: p, path: path, conn: c, log: log.With("pid", p.pid)}
	r, w := io.Pipe()
	h.out = r
	seen := max(0, len(c.Hello.Backlog)-c.Hello.Unseen)
	for _, line := range c.Hello.Backlog[:seen] {
		if !OwnPoll(line) {
			h.seen = append(h.seen, line)
		}
	}
	go h.wait(func() error { return h.follow(w, c.Hello.Backlog[seen:]) })
	return h
}

// follow writes unseen, then the engine's output as its shim sends it, to
// w until the shim's report of the exit, or the loss of the connection to
// the shim (errDetached once poold detached), and closes w. A lost
// connection is logged, and the engine is then treated as one that
// exited, with the reason (lost is set: Stop asks again through a new
// connection).
func (h *Shimmed) follow(w *io.PipeWriter, unseen []string) error {
	defer w.Close()
	for _, line := range unseen {
		_, _ = io.WriteString(w, line+"\n")
	}
	for {
		m, err := h.conn.Next()
		switch {
		case h.detached.Load():
			return errDetached
		case err != nil:
			h.lost.Store(true)
			h.log.Warn("lost the connection to the engine's supervisor; the engine is treated as failed", "shim", h.path, "err", err)
			return fmt.Errorf("its supervisor (poold engine-shim) is gone: %w", err)
		case m.Kind == shim.KindExit:
			h.conn.Close()
			if m.Status == "" {
				return nil
			}
			return errors.New(m.Status)
		}
		_, _ = io.WriteString(w, m.Line+"\n")
	}
}

// Seen is the output of the hello's backlog that a previous poold
// received, poold's own polls left out.
func (h *Shimmed) Seen() []string { return h.seen }

// Stop stops the engine through its shim (stopShimmed) and ends itself
// only what is left once the shim reported the exit or is gone, or when
// the shim failed to stop it.
func (h *Shimmed) Stop(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	if err := h.stopShimmed(grace, hurry, log); err != nil {
		log.Error("the engine's supervisor did not stop it; poold ends its processes itself", "err", err)
	}
	return h.end(grace, hurry, log)
}

// StopThroughShim stops an engine that is not to be adopted through its
// shim alone (stopShimmed), which stops it under the stop contract; it
// waits for the shim's report of the exit, at most grace and the SIGKILL
// wait (cut short once hurry is closed, as Stop's). Nothing is signalled
// by poold: its pid and group may be another process's now.
func (h *Shimmed) StopThroughShim(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	log.Info("stopping an engine through its shim", "shim_pid", h.conn.Hello.ShimPID)
	return h.stopShimmed(grace, hurry, log)
}

// Signal asks the shim to send sig to the engine.
func (h *Shimmed) Signal(sig syscall.Signal) error {
	return h.conn.Signal(sig, shimRequestTimeout)
}

// Detach lets go of the engine for the next poold to adopt.
func (h *Shimmed) Detach() bool {
	h.detached.Store(true)
	h.conn.Close()
	return true
}

// Record is the engine as the ledger records it, with its shim's socket.
func (h *Shimmed) Record() LedgerEngine {
	r := h.record()
	r.Shim = h.path
	return r
}

// Fingerprint is the fingerprint of the engine's command line and
// environment that its shim holds (shim.Fingerprint).
func (h *Shimmed) Fingerprint() string { return h.conn.Hello.Fingerprint }

// Recorded checks that the engine is the process that its record names:
// the pid started at the recorded time, neither a zombie nor exited, and
// reported running by its shim. Its error wraps ErrNotRecorded.
func (h *Shimmed) Recorded() error {
	if st, err := ProcStat(h.pid); err != nil || st.Start != h.startTicks || st.State == 'Z' || isClosed(h.exited) {
		return fmt.Errorf("its process %d %w", h.pid, ErrNotRecorded)
	}
	if st, err := h.conn.State(AttachTimeout); err != nil || !st.Running || st.Stopping {
		return fmt.Errorf("its supervisor does not report it running (%+v, %v): its process %d %w", st, err, h.pid, ErrNotRecorded)
	}
	return nil
}

// stopShimmed stops the engine through its shim (shim.OpStop with grace)
// and waits for the shim's report of the exit (stopVia). An engine whose
// connection was lost is stopped through a new one, when its shim still
// answers. It returns nil once the exit is reported, or when the shim is
// gone: what the engine left is then nobody's, and the caller may end it.
// It returns an error when the shim does not report the exit in time,
// having closed the connection (Exited is then closed).
func (h *Shimmed) stopShimmed(grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	c, exited := h.conn, (<-chan struct{})(h.exited)
	if isClosed(exited) {
		if !h.lost.Load() {
			return nil // the shim reported the exit
		}
		var err error
		if c, exited, err = reattach(h.path, h.pid); err != nil {
			log.Warn("the engine's supervisor is gone; what its engine left is ended by poold", "err", err)
			return nil
		}
		defer c.Close()
		log.Info("attached again to the engine's supervisor to stop it", "shim", h.path)
	}
	return stopVia(c, exited, grace, hurry, log)
}

// reattach attaches to the shim at path, which must run the engine pid, and
// returns the connection and a channel closed once the shim reported the
// exit or the connection ended.
func reattach(path string, pid int) (*shim.Conn, <-chan struct{}, error) {
	c, err := shim.Attach(path, AttachTimeout)
	if err != nil {
		return nil, nil, err
	}
	if c.Hello.PID != pid {
		c.Close()
		return nil, nil, fmt.Errorf("its socket's supervisor runs pid %d, not %d", c.Hello.PID, pid)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			if m, err := c.Next(); err != nil || m.Kind == shim.KindExit {
				return
			}
		}
	}()
	return c, exited, nil
}

// stopVia asks the shim attached as c to stop its engine with grace
// (negative: the shim's own, which its hello gives) and waits until exited
// is closed, at most grace and the SIGKILL wait; once hurry is closed (nil
// never is) it asks for SIGKILL. Past the wait it closes c, waits for
// exited, and returns an error.
func stopVia(c *shim.Conn, exited <-chan struct{}, grace time.Duration, hurry <-chan struct{}, log *slog.Logger) error {
	if err := c.Stop(grace, shimRequestTimeout); err != nil {
		log.Warn("asking the engine's supervisor to stop it", "err", err)
	}
	if grace < 0 {
		grace = c.Hello.Grace
	}
	wait := grace + KillWait + OutputWait
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-exited:
			return nil
		case <-hurry:
			hurry = nil
			if err := c.Signal(syscall.SIGKILL, shimRequestTimeout); err != nil {
				log.Warn("asking the engine's supervisor to hurry its stop", "err", err)
			}
		case <-t.C:
			c.Close()
			<-exited
			return fmt.Errorf("its supervisor did not report the engine's exit within %s", wait)
		}
	}
}

// StopOrphan stops, through its shim and with grace, the engine that rec
// records when no pool took it (its pool or profile is gone, say, or poold
// stop-engines stops it), so that the reap (Ledger.ReapEngines) finds at
// most what the engine left, held by no shim; it logs to log. A shim that
// does not answer is left to that reap. It is what OpenLedger takes as its
// stopShim.
func StopOrphan(rec LedgerEngine, grace time.Duration, log *slog.Logger) {
	if rec.Shim == "" {
		return
	}
	c, exited, err := reattach(rec.Shim, rec.PID)
	if err != nil {
		return
	}
	defer c.Close()
	log = log.With("pool", rec.Pool, "profile", rec.Profile, "pid", rec.PID)
	log.Info("stopping an engine that no pool takes through its shim", "shim", rec.Shim)
	if err := stopVia(c, exited, grace, nil, log); err != nil {
		log.Error("stopping an engine that no pool takes", "err", err)
	}
}
