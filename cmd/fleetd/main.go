// Command fleetd routes OpenAI-compatible requests across many hosts' poold
// daemons, to where each model is cheapest to serve. Usage:
//
//	fleetd [serve] --listen ADDR --hosts FILE [--log-level L] [--log-format F] [...]
//	fleetd status [--addr URL] [--json]
//	fleetd check FILE
//	fleetd version
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && (len(args[0]) == 0 || args[0][0] != '-') {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		os.Exit(serve(ctx, args))
	case "status":
		os.Exit(status(args, os.Stdout))
	case "check":
		os.Exit(check(args))
	case "version":
		fmt.Println("fleetd " + version + " (" + revision() + ")")
	default:
		fmt.Fprintf(os.Stderr, "fleetd: unknown command %q (serve, status, check, version)\n", cmd)
		os.Exit(2)
	}
}

// revision is the VCS revision the binary was built from, or "unknown".
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
