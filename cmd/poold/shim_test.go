package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/poold/poold/internal/cli"
)

// poold engine-shim refuses, as a usage error naming what is wrong, a
// command line that lacks what it needs, before it serves or starts
// anything.
func TestEngineShimUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--socket and --token are required"},
		{[]string{"--socket", "s", "--", "true"}, "--socket and --token are required"},
		{[]string{"--socket", "s", "--token", "T", "--adopt-timeout", "0s", "--", "true"}, "--adopt-timeout must be positive"},
		{[]string{"--socket", "s", "--token", "T"}, "no engine command"},
		{[]string{"--socket", "s", "--token", "T", "--no-such-flag", "--", "true"}, "no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := engineShim(c.args, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("engine-shim %q: exit %d, stderr %q; want %d saying %q", c.args, code, stderr.String(), cli.ExitUsage, c.want)
		}
	}
}
