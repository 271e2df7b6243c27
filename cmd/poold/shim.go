package main

import (
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/engine"
)

// engineShim is `poold engine-shim`, an engine's supervisor, which poold
// runs itself for each engine with shims (engine.Shims): it parses args into an
// engine.ShimConfig and runs engine.RunShim, logging to stderr (which poold
// points to a file beside the socket).
func engineShim(args []string, stdout, stderr io.Writer) int {
	const usage = "--socket PATH --token TOKEN --adopt-timeout D [flags] -- COMMAND [ARG...]"
	fl := cli.NewFlagSet("poold engine-shim")
	var c engine.ShimConfig
	fl.StringVar(&c.Socket, "socket", "", "the Unix socket to serve")
	fl.StringVar(&c.Token, "token", "", "the token that marks the engine's processes")
	fl.StringVar(&c.Fingerprint, "fingerprint", "", "the fingerprint of the engine's command and environment, for the hello")
	fl.StringVar(&c.Cgroup, "cgroup", "", "the engine's own cgroup, to start it in (cgroup mode)")
	fl.DurationVar(&c.AdoptTimeout, "adopt-timeout", time.Minute, "how long the engine runs on with no poold attached")
	fl.DurationVar(&c.Grace, "grace", 90*time.Second, "the engine's stop: the wait between SIGTERM and SIGKILL")
	if code, ok := cli.ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	c.Argv = fl.Args()
	switch {
	case c.Socket == "" || c.Token == "":
		return cli.UsageError(stderr, fl, usage, errors.New("--socket and --token are required"))
	case c.AdoptTimeout <= 0:
		return cli.UsageError(stderr, fl, usage, errors.New("--adopt-timeout must be positive"))
	case len(c.Argv) == 0:
		return cli.UsageError(stderr, fl, usage, errors.New("no engine command"))
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "engine-shim", "socket", c.Socket)
	if err := engine.RunShim(c, log); err != nil {
		log.Error("engine-shim", "err", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}
