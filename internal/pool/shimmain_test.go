package pool

import (
	"flag"
	"io"
	"log/slog"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// shimMain is `engine-shim` for this test binary, which serves as its own
// engines' shim: the flags proc.Shims gives, parsed into a proc.ShimConfig for
// proc.RunShim (in poold, cmd/poold parses them).
func shimMain(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("engine-shim", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var c proc.ShimConfig
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
	if err := proc.RunShim(c, log); err != nil {
		log.Error("engine-shim", "err", err)
		return 1
	}
	return 0
}
