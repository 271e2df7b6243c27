package pool

import "regexp"

// Kinds of engine output line the pool acts on, as bits of engine.noted.
const (
	notePortTaken   uint32 = 1 << iota // the engine could not bind its port
	noteMemoryShort                    // vLLM found too little free GPU memory at start-up
)

// noteLines match each kind of line, whatever its letter case: Python's
// "[Errno 98] Address already in use", a Go server's "bind: address
// already in use" and newer vLLM's "Port N is already in use"; vLLM's
// memoryShortLine.
var noteLines = []struct {
	bit uint32
	re  *regexp.Regexp
}{
	{notePortTaken, regexp.MustCompile(`(?i)address already in use|port \d+ is already in use`)},
	{noteMemoryShort, regexp.MustCompile(`(?i)` + regexp.QuoteMeta(memoryShortLine))},
}

// note records the kinds of line that line is.
func (e *engine) note(line string) {
	for _, n := range noteLines {
		if n.re.MatchString(line) {
			e.noted.Or(n.bit)
		}
	}
}

// printed reports whether the exited engine printed a line of kind bit.
// Call it once the engine's group is stopped: it waits (bounded) for the
// engine's last output lines.
func (e *engine) printed(bit uint32) bool {
	select {
	case <-e.exited:
	default:
		return false
	}
	e.awaitOutput()
	return e.noted.Load()&bit != 0
}
