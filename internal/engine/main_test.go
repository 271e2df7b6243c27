package engine

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestMain lets this test binary serve as its engines' shim: a Supervisor
// with Shims runs `{self} engine-shim …`, and self is the test binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "engine-shim" {
		os.Exit(shimMain(os.Args[2:], os.Stderr))
	}
	os.Exit(m.Run())
}

// shimMain is `engine-shim` for this test binary: the flags Shims.command
// gives, parsed into a ShimConfig for RunShim (in poold, cmd/poold parses
// them).
func shimMain(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("engine-shim", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var c ShimConfig
	fl.StringVar(&c.Socket, "socket", "", "")
	fl.StringVar(&c.Token, "token", "", "")
	fl.StringVar(&c.Fingerprint, "fingerprint", "", "")
	fl.StringVar(&c.Cgroup, "cgroup", "", "")
	fl.DurationVar(&c.AdoptTimeout, "adopt-timeout", 0, "")
	fl.DurationVar(&c.Grace, "grace", 0, "")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	c.Argv = fl.Args()
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "engine-shim", "socket", c.Socket)
	if err := RunShim(c, log); err != nil {
		log.Error("engine-shim", "err", err)
		return 1
	}
	return 0
}
