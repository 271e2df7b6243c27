package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/poold/poold/internal/engine"
	"github.com/poold/poold/internal/pool"
)

// leftoverGrace is how long the engine processes a previous poold left behind
// get between SIGTERM and SIGKILL.
const leftoverGrace = 5 * time.Second

// containment sets up how engines' processes are contained (mode is the
// containment setting) and says which it is, once: process-group mode, where
// a cgroup was possible but not found, is logged as a degraded mode.
func containment(mode string, log *slog.Logger) (*engine.Containment, error) {
	c, err := engine.NewContainment(mode)
	if err != nil {
		return nil, err
	}
	st := c.Status()
	switch {
	case st.Mode == engine.ModeCgroup:
		log.Info("engines run in cgroups of their own", "containment", st.Mode, "cgroup", st.Cgroup)
	case mode == engine.ModeAuto:
		log.Warn("degraded containment: engines run in process groups, and a process that leaves its group and clears its environment can outlive its engine", "containment", st.Mode, "reason", st.Reason)
	default:
		log.Info("engines run in process groups", "containment", st.Mode, "reason", st.Reason)
	}
	return c, nil
}

// openState opens the state directory's engine ledger. A directory that
// another poold holds is an error, and so is one that others could have
// written (engine.ErrUntrusted: the error names the path and the fix); one
// that cannot be created (poold run by a user outside systemd) only
// disables the ledger, with a warning: no crash clean-up, and no engine
// kept across a restart.
func openState(dir string, contain *engine.Containment, log *slog.Logger) (*engine.Ledger, error) {
	ledger, err := engine.OpenLedger(dir, contain, engine.StopOrphan, log)
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, engine.ErrUntrusted):
		return nil, fmt.Errorf("state-dir: %w", err)
	case err != nil:
		log.Warn("no state directory: engines left by a crash will not be cleaned up at the next start, nor kept across a restart", "state-dir", dir, "err", err)
		return nil, nil
	}
	return ledger, nil
}

// takeOver deals with the engines that the previous poold left, before any
// engine starts: with adopt, the pools adopt those that pass verification
// (Set.Adopt); the ledger then stops what is left of the others, and (cgroup
// mode) any engine group left under the delegated cgroup but the adopted.
func takeOver(ctx context.Context, ledger *engine.Ledger, pools *pool.Set, adopt bool, contain *engine.Containment, log *slog.Logger) {
	left, err := ledger.Recorded()
	if err != nil {
		log.Error("reading the engines left by a previous run", "err", err)
	}
	if adopt {
		left = pools.Adopt(ctx, left)
	}
	reaped, err := ledger.ReapEngines(left, leftoverGrace)
	strays, serr := contain.Reap(leftoverGrace, ledger.Cgroups(), log)
	reaped = append(reaped, strays...)
	if err := errors.Join(err, serr); err != nil {
		log.Error("stopping engines left by a previous run", "err", err)
	} else if len(reaped) > 0 {
		log.Warn("stopped engine processes left by a previous run", "pids", reaped)
	}
}
