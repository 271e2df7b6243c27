package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/poold/poold/internal/fleet"
)

// check validates a hosts file: exit 0 valid, 1 invalid, 2 unreadable.
func check(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: fleetd check FILE")
		return 2
	}
	_, _, err := fleet.LoadFile(args[0])
	var pathErr *fs.PathError
	switch {
	case err == nil:
		fmt.Printf("%s: ok\n", args[0])
		return 0
	case errors.As(err, &pathErr):
		fmt.Fprintf(os.Stderr, "fleetd check: %v\n", err)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "%s: invalid:\n%v\n", args[0], err)
		return 1
	}
}
