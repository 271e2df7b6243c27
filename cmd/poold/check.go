package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/profile"
)

// check validates a profiles file: exit 0 valid, 1 invalid, 2 unreadable. An
// invalid file is reported as "FILE: invalid:" on stderr, then every problem
// on a line of its own, each naming its JSON path. A valid file is "FILE: ok"
// on stdout, and what would fail on host (removed vLLM flags, missing engine
// binaries and model paths) is "FILE: warnings:" on stderr, then a line per
// warning: warnings alone still exit 0.
func check(args []string, host profile.Host, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("poold check")
	if code, ok := cli.ParseFlags(fl, "FILE", args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() != 1 {
		return cli.UsageError(stderr, fl, "FILE", errors.New("one profiles file is required"))
	}
	args = fl.Args()
	c, _, err := profile.Load(args[0])
	var pathErr *fs.PathError
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "%s: ok\n", args[0])
		if warnings := c.Warnings(host); len(warnings) > 0 {
			fmt.Fprintf(stderr, "%s: warnings:\n%v\n", args[0], errors.Join(warnings...))
		}
		return 0
	case errors.As(err, &pathErr):
		fmt.Fprintf(stderr, "poold check: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", args[0], err)
		return 1
	}
}

// localHost is this machine, for check's warnings.
func localHost() profile.Host {
	self, _ := os.Executable()
	return profile.Host{LookPath: exec.LookPath, Stat: os.Stat, Self: self}
}
