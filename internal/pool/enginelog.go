package pool

// An engine's output reaches poold's log one line per record: the message
// is EngineOutput and the line, as the engine printed it, is the string
// attribute EngineLine, beside the pool, profile and pid of the engine. The
// daemon's text format prints such records as the raw line after those
// three (cmd/poold); its JSON format keeps the line a field of its own.
const (
	EngineOutput = "engine output"
	EngineLine   = "line"
)
