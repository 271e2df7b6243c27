package main

import (
	"fmt"

	"github.com/poold/poold/internal/openai"
)

// checkLimits validates the timeouts, limits and backoff settings.
func (s *settings) checkLimits() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    int64
	}{
		{"upstream-header-timeout", int64(s.UpstreamHeaderTimeout)},
		{"stream-idle-timeout", int64(s.StreamIdleTimeout)},
		{openai.ClientWriteTimeoutSetting, int64(s.ClientWriteTimeout)},
		{"read-timeout", int64(s.ReadTimeout)},
		{"read-header-timeout", int64(s.ReadHeaderTimeout)},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", d.name))
		}
	}
	if s.MaxHeaderBytes <= 0 {
		errs = append(errs, fmt.Errorf("max-header-bytes: must be positive, not %d", s.MaxHeaderBytes))
	}
	if s.HeaderBytesBudget < int64(s.MaxHeaderBytes) {
		errs = append(errs, fmt.Errorf("header-bytes-budget: must hold one largest header block (max-header-bytes, %d), not %d", s.MaxHeaderBytes, s.HeaderBytesBudget))
	}
	if s.RestartBackoff <= 0 || s.MaxRestartBackoff < s.RestartBackoff {
		errs = append(errs, fmt.Errorf("restart-backoff, restart-backoff-max: need 0 < restart-backoff (%s) <= restart-backoff-max (%s)", s.RestartBackoff, s.MaxRestartBackoff))
	}
	return errs
}
