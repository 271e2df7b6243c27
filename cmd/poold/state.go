package main

import (
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/poold/poold/internal/pool"
)

// leftoverGrace is how long the engine processes a previous poold left behind
// get between SIGTERM and SIGKILL.
const leftoverGrace = 5 * time.Second

// openState opens the state directory's engine ledger and stops what a
// crashed predecessor left running, before any engine starts. A directory that
// another poold holds is an error; one that cannot be created (poold run by a
// user outside systemd) only disables the crash clean-up, with a warning.
func openState(dir string, log *slog.Logger) (*pool.Ledger, error) {
	ledger, err := pool.OpenLedger(dir, log)
	switch {
	case errors.Is(err, syscall.EWOULDBLOCK):
		return nil, fmt.Errorf("state-dir: %w", err)
	case err != nil:
		log.Warn("no state directory: engines left by a crash will not be cleaned up at the next start", "state-dir", dir, "err", err)
		return nil, nil
	}
	reaped, err := ledger.Reap(leftoverGrace)
	if err != nil {
		log.Error("stopping engines left by a previous run", "err", err)
	} else if len(reaped) > 0 {
		log.Warn("stopped engine processes left by a previous run", "pids", reaped)
	}
	return ledger, nil
}
