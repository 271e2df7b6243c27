package main

import "github.com/poold/poold/internal/cli"

// version and commit are set at build time with -ldflags
// "-X main.version=v1.2.3 -X main.commit=<sha>" (the Makefile does).
var version, commit = "dev", ""

// revision is the commit the binary was built from (cli.Revision).
func revision() string { return cli.Revision(commit) }

func versionString() string { return "poold " + version + " (" + revision() + ")" }
