// Command vulncheck reads govulncheck's JSON stream on stdin and fails when
// the code calls a known-vulnerable function of a required module. Findings in
// the standard library are printed as warnings: they are fixed by a newer Go
// toolchain, not by this module's dependencies.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// message is the part of one govulncheck JSON message read here.
type message struct {
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Function string `json:"function"`
		} `json:"trace"`
	} `json:"finding"`
}

func main() {
	dec := json.NewDecoder(os.Stdin)
	var stdlib, deps []string
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "vulncheck: reading govulncheck output: %v\n", err)
			os.Exit(2)
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 || f.Trace[0].Function == "" {
			continue // not called: govulncheck reports imported or required only
		}
		line := fmt.Sprintf("%s in %s (fixed in %s)", f.OSV, f.Trace[0].Module, f.FixedVersion)
		if f.Trace[0].Module == "stdlib" {
			stdlib = append(stdlib, line)
		} else {
			deps = append(deps, line)
		}
	}
	for _, l := range slices.Compact(slices.Sorted(slices.Values(stdlib))) {
		fmt.Println("warning: called, in the Go standard library (needs a newer toolchain):", l)
	}
	for _, l := range slices.Compact(slices.Sorted(slices.Values(deps))) {
		fmt.Println("FAIL: called, in a required module:", l)
	}
	if len(deps) > 0 {
		os.Exit(1)
	}
	fmt.Println("vulncheck: no known-vulnerable function of a required module is called")
}
