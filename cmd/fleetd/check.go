package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/fleet"
	"github.com/poold/poold/internal/tenant"
)

// checkUsage is check's usage line after the command's name.
const checkUsage = "[--tenants TENANTS] [HOSTS]"

// check validates a hosts file, a tenants file, or both: exit 0 valid, 1
// invalid, 2 unreadable or a usage error.
func check(args []string, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("fleetd check")
	tenants := fl.String("tenants", "", "a tenants file to validate")
	if code, ok := cli.ParseFlags(fl, checkUsage, args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() > 1 || fl.NArg() == 0 && *tenants == "" {
		return cli.UsageError(stderr, fl, checkUsage, errors.New("a hosts file, a tenants file (--tenants), or both"))
	}
	code := 0
	if *tenants != "" {
		_, _, err := tenant.Load(*tenants)
		code = max(code, report(*tenants, err, stdout, stderr))
	}
	if fl.NArg() == 1 {
		_, _, err := fleet.LoadFile(fl.Arg(0))
		code = max(code, report(fl.Arg(0), err, stdout, stderr))
	}
	return code
}

// report prints what checking file found and returns its exit code.
func report(file string, err error, stdout, stderr io.Writer) int {
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
