// Command poold serves OpenAI-compatible requests from engines it starts and
// swaps on a host's GPU pools. Usage:
//
//	poold [serve] --listen ADDR --profiles FILE [--log-level L] [--log-format F]
//	poold check FILE
//	poold status [--addr URL] [--json]
//	poold usage [--since T] [--until T] [--by tenant|model|pool|day] [--format table|json|csv]
//	poold usage reconcile --access-log FILE
//	poold version
//	poold engine-sim [vllm serve flags]   (the bundled vLLM simulator)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/poold/poold/internal/enginesim"
)

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && !isFlag(args[0]) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		os.Exit(serve(ctx, args))
	case "check":
		os.Exit(check(args, os.Stdout, os.Stderr))
	case "status":
		os.Exit(status(args, os.Stdout, os.Stderr))
	case "usage":
		os.Exit(usageCommand(args, os.Stdout, os.Stderr))
	case "version":
		fmt.Println(versionString())
	case "engine-sim":
		os.Exit(enginesim.Main(args))
	default:
		fmt.Fprintf(os.Stderr, "poold: unknown command %q (serve, check, status, usage, version, engine-sim)\n", cmd)
		os.Exit(2)
	}
}

func isFlag(s string) bool { return len(s) > 0 && s[0] == '-' }
