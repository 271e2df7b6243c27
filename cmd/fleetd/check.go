package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/fleet"
)

// check validates a hosts file: exit 0 valid, 1 invalid, 2 unreadable or a
// usage error.
func check(args []string, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("fleetd check")
	if code, ok := cli.ParseFlags(fl, "FILE", args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() != 1 {
		return cli.UsageError(stderr, fl, "FILE", errors.New("one hosts file is required"))
	}
	file := fl.Arg(0)
	_, _, err := fleet.LoadFile(file)
	var pathErr *fs.PathError
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "%s: ok\n", file)
		return 0
	case errors.As(err, &pathErr):
		fmt.Fprintf(stderr, "fleetd check: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", file, err)
		return 1
	}
}
