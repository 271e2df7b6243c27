//go:build race

package e2e

// raceEnabled builds poold with the race detector when the tests run with it.
const raceEnabled = true
