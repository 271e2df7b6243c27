package pool

import "strings"

// Kinds of engine output line the pool acts on, as bits of engine.noted.
const (
	noteMemoryShort uint32 = 1 << iota // memoryShortLine
)

// noteLines are the lower-cased texts that mark each kind of line.
var noteLines = []struct {
	bit  uint32
	text string
}{
	{noteMemoryShort, memoryShortLine},
}

// note records the kinds of line that line is, whatever its letter case.
func (e *engine) note(line string) {
	lower := strings.ToLower(line)
	for _, n := range noteLines {
		if strings.Contains(lower, n.text) {
			e.noted.Or(n.bit)
		}
	}
}
