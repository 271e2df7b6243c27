package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/poold/poold/internal/proxy"
)

// checkLimits validates the timeouts, limits and backoff settings.
func (s *settings) checkLimits() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    int64
	}{
		{"upstream-header-timeout", int64(s.UpstreamHeaderTimeout)},
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
	if s.RestartBackoff <= 0 || s.MaxRestartBackoff < s.RestartBackoff {
		errs = append(errs, fmt.Errorf("restart-backoff, restart-backoff-max: need 0 < restart-backoff (%s) <= restart-backoff-max (%s)", s.RestartBackoff, s.MaxRestartBackoff))
	}
	return errs
}

// apiKeys builds the API-key set from the api-keys list (each entry may hold
// several keys separated by commas) and the api-keys-file (one key per line;
// blank lines and # comments skipped). It returns nil when no key is set.
// Errors never show a key.
func apiKeys(list []string, file string) (*proxy.APIKeys, error) {
	var keys []string
	for _, k := range list {
		keys = append(keys, strings.Split(k, ",")...)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("api-keys-file: %w", err)
		}
		n := len(keys)
		for line := range strings.Lines(string(b)) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				keys = append(keys, line)
			}
		}
		if len(keys) == n {
			return nil, fmt.Errorf("api-keys-file: %q holds no key", file)
		}
	}
	k, err := proxy.NewAPIKeys(keys)
	if err != nil {
		return nil, fmt.Errorf("api-keys: %w", err)
	}
	return k, nil
}
