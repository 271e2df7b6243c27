package main

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/engine"
)

// stopEngines is `poold stop-engines`: it stops every engine that the
// state directory's ledger records (those a stopped poold left running for
// its successor), under the stop contract, and clears the ledger. poold must
// not run: it holds the directory. The directory and each record are
// checked as poold checks them (engine.OpenLedger); stop-engines runs outside
// poold's delegated cgroup, so it acts on no recorded cgroup: it finds each
// engine by its process group and token, and the next poold removes the
// empty groups.
func stopEngines(args []string, stdout, stderr io.Writer) int {
	const usage = "[--state-dir DIR] [--grace D]"
	fl := cli.NewFlagSet("poold stop-engines")
	dir := fl.String("state-dir", cmp.Or(os.Getenv("POOLD_STATE_DIR"), "/var/lib/poold"), "poold's state directory (default $POOLD_STATE_DIR, else /var/lib/poold)")
	grace := fl.Duration("grace", leftoverGrace, "the wait between SIGTERM and SIGKILL")
	if code, ok := cli.ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() > 0 {
		return cli.UsageError(stderr, fl, usage, fmt.Errorf("unexpected arguments %q", fl.Args()))
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ledger, err := engine.OpenLedger(*dir, nil, engine.StopOrphan, log)
	if err != nil {
		fmt.Fprintf(stderr, "poold stop-engines: %v\n", err)
		return cli.ExitFailure
	}
	defer ledger.Close()
	stopped, err := ledger.Reap(*grace)
	if err != nil {
		fmt.Fprintf(stderr, "poold stop-engines: %v\n", err)
		return cli.ExitFailure
	}
	fmt.Fprintf(stdout, "stopped %d engine processes %v\n", len(stopped), stopped)
	return cli.ExitOK
}
