package main

import "runtime/debug"

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

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

func versionString() string { return "poold " + version + " (" + revision() + ")" }
