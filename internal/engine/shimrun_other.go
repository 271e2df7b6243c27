//go:build !linux

package engine

import "log/slog"

// RunShim refuses: engines run only on Linux, and so do their shims.
func RunShim(ShimConfig, *slog.Logger) error { return errNotLinux }
