package pool

import (
	"flag"
	"io"
	"log/slog"
)

// shimMain is `engine-shim` for this test binary, which serves as its own
// engines' shim: the flags Shims.command gives, parsed into a ShimConfig for
// RunShim (in poold, cmd/poold parses them).
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
