//go:build !linux

package pool

import (
	"errors"
	"log/slog"
)

// RunShim refuses: engines run only on Linux, and so do their shims.
func RunShim(ShimConfig, *slog.Logger) error {
	return errors.New("poold runs engines only on Linux: it needs process groups with a parent-death signal and /proc")
}
