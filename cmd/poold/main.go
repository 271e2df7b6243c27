// Command poold serves OpenAI-compatible requests from engines it starts and
// swaps on a host's GPU pools. Usage:
//
//	poold [serve] [flags]                 run the daemon
//	poold check [FILE] [--tenants FILE]   validate a profiles file, a tenants file or both
//	poold hash-key [KEY]                  print an API key's hash for a tenants file
//	poold status [--addr ADDR] [--json]   print a running poold's pools
//	poold usage [reconcile] [flags]       usage and cost from the usage ledger
//	poold stop-engines [--state-dir DIR]  stop the engines a stopped poold left running
//	poold engine-sim [MODEL] [flags]      run the bundled vLLM simulator
//	poold version
//	poold help [COMMAND]
//
// It exits 0 on success, 1 on failure and 2 on a usage error.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/enginesim"
)

func main() {
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

func program() *cli.Program {
	return &cli.Program{
		Name:    "poold",
		Summary: "poold serves OpenAI-compatible requests from the engines it starts and swaps on this host's GPU pools.",
		Version: versionString(),
		Commands: []cli.Command{
			{Name: "serve", Args: "[flags]", Summary: "run the daemon (the default command)", Run: cli.UntilSignal(serve)},
			{Name: "check", Args: "[PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE]", Summary: "validate a profiles file, a tenants file or both (every problem with its JSON path), and warn about what would fail on this host",
				Run: func(args []string) int {
					self, _ := os.Executable()
					return check(args, localHost(), self, os.Stdout, os.Stderr)
				}},
			{Name: "hash-key", Args: "[KEY]", Summary: "print the hash of an API key as a tenants file holds it (keys from stdin without KEY)",
				Run: func(args []string) int { return hashKey(args, os.Stdin, os.Stdout, os.Stderr) }},
			{Name: "status", Args: "[--addr ADDR] [--json]", Summary: "print a running poold's pools as a table",
				Run: func(args []string) int { return status(args, os.Stdout, os.Stderr) }},
			{Name: "usage", Args: "[reconcile --access-log FILE] [flags]", Summary: "usage and cost per tenant, model, pool or day from the usage ledger; reconcile checks it against an access log",
				Run: func(args []string) int { return usageCommand(args, os.Stdout, os.Stderr) }},
			{Name: "stop-engines", Args: "[--state-dir DIR] [--grace D]", Summary: "stop every engine that a stopped poold left running for its successor (keep-engines-on-restart), to free the GPUs",
				Run: func(args []string) int { return stopEngines(args, os.Stdout, os.Stderr) }},
			{Name: "engine-sim", Args: "[MODEL] [flags]", Summary: "run the bundled vLLM simulator (the engine of the demo and the tests)",
				Run: enginesim.Main},
			{Name: "engine-shim", Args: "[flags] -- COMMAND", Summary: "an engine's supervisor, which poold runs itself", Hidden: true,
				Run: func(args []string) int { return engineShim(args, os.Stdout, os.Stderr) }},
		},
		More: func(w io.Writer) {
			fmt.Fprintf(w, "Flags of serve (each also POOLD_<FLAG> in the environment, FLAG: in the settings file):\n%s", serveFlags().FlagUsages())
		},
	}
}
