package proxy

import (
	"os"
	"testing"

	"github.com/poold/poold/internal/enginesim"
)

// TestMain lets this test binary serve as an engine: profiles run
// `{poold} engine-sim …`, and {poold} is the test binary itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "engine-sim" {
		os.Exit(enginesim.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}
