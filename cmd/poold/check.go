package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/profile"
)

// check validates a profiles file: exit 0 valid, 1 invalid, 2 unreadable. An
// invalid file is reported as "FILE: invalid:" on stderr, then every problem
// on a line of its own, each naming its JSON path.
func check(args []string, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("poold check")
	if code, ok := cli.ParseFlags(fl, "FILE", args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() != 1 {
		return cli.UsageError(stderr, fl, "FILE", errors.New("one profiles file is required"))
	}
	args = fl.Args()
	_, _, err := profile.Load(args[0])
	var pathErr *fs.PathError
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "%s: ok\n", args[0])
		return 0
	case errors.As(err, &pathErr):
		fmt.Fprintf(stderr, "poold check: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", args[0], err)
		return 1
	}
}
