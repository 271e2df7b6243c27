// Command fleetd routes OpenAI-compatible requests across many hosts' poold
// daemons, to where each model is cheapest to serve. Usage:
//
//	fleetd [serve] [flags]                 run the router
//	fleetd check [--tenants FILE] [HOSTS]  validate a hosts file, a tenants file, or both
//	fleetd status [--addr ADDR] [--json]   print a running fleetd's hosts
//	fleetd version
//	fleetd help [COMMAND]
//
// It exits 0 on success, 1 on failure and 2 on a usage error.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/poold/poold/internal/cli"
)

// version and commit are set at build time with -ldflags
// "-X main.version=v1.2.3 -X main.commit=<sha>" (the Makefile does).
var version, commit = "dev", ""

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

func program() *cli.Program {
	return &cli.Program{
		Name:    "fleetd",
		Summary: "fleetd routes OpenAI-compatible requests across many hosts' poold daemons, to where each model is cheapest to serve.",
		Version: "fleetd " + version + " (" + revision() + ")",
		Commands: []cli.Command{
			{Name: "serve", Args: "[flags]", Summary: "run the router (the default command)", Run: cli.UntilSignal(serve)},
			{Name: "check", Args: checkUsage, Summary: "validate a hosts file, a tenants file (--tenants), or both",
				Run: func(args []string) int { return check(args, os.Stdout, os.Stderr) }},
			{Name: "status", Args: "[--addr ADDR] [--json]", Summary: "print a running fleetd's hosts and their pools as a table",
				Run: func(args []string) int { return status(args, os.Stdout, os.Stderr) }},
		},
		More: func(w io.Writer) {
			fmt.Fprintf(w, "Flags of serve (each also FLEETD_<FLAG> in the environment):\n%s", serveFlags().FlagUsages())
		},
	}
}

// revision is the commit the binary was built from (cli.Revision).
func revision() string { return cli.Revision(commit) }
