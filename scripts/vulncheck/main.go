// Command vulncheck reads govulncheck's JSON stream on stdin and fails when
// the code calls a known-vulnerable function, of a required module or of the
// standard library: a finding in the standard library is fixed by the
// toolchain that go.mod names, so it fails too, naming the Go version that
// fixes it.
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
		fmt.Println("FAIL: called, in the Go standard library (raise go.mod's toolchain):", l)
	}
	for _, l := range slices.Compact(slices.Sorted(slices.Values(deps))) {
		fmt.Println("FAIL: called, in a required module:", l)
	}
	if len(stdlib)+len(deps) > 0 {
		os.Exit(1)
	}
	fmt.Println("vulncheck: no known-vulnerable function is called, in the standard library or a required module")
}
