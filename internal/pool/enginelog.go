package pool

import (
	"io"
	"log/slog"
	"regexp"
	"strings"
)

// An engine's output reaches poold's log one line per record: the message
// is EngineOutput and the line, as the engine printed it, is the string
// attribute EngineLine, beside the pool, profile and pid of the engine. The
// daemon's text format prints such records as the raw line after those
// three (cmd/poold); its JSON format keeps the line a field of its own.
const (
	EngineOutput = "engine output"
	EngineLine   = "line"
)

// Kinds of engine output line the pool acts on, as bits of engine.noted.
const (
	notePortTaken   uint32 = 1 << iota // the engine could not bind its port
	noteMemoryShort                    // vLLM found too little free GPU memory at start-up
)

// noteLines match each kind of line, whatever its letter case: portInUse,
// and vLLM's memoryShortLine.
var noteLines = []struct {
	bit uint32
	re  *regexp.Regexp
}{
	{notePortTaken, portInUse},
	{noteMemoryShort, regexp.MustCompile(`(?i)` + regexp.QuoteMeta(memoryShortLine))},
}

// note records the kinds of line that line is, until the engine served.
func (e *engine) note(line string) {
	if e.served.Load() {
		return
	}
	for _, n := range noteLines {
		if n.re.MatchString(line) {
			e.noted.Or(n.bit)
		}
	}
}

// reasonLine matches, from the exception's name to the line's end, a line
// of output that reads as the exception ending a Python traceback
// ("RuntimeError: …", "torch.OutOfMemoryError: …", whatever prefixes the
// engine's log format puts before it): what the engine says went wrong.
var reasonLine = regexp.MustCompile(`(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S.*`)

// noteReason records line as the engine's reason when it reads as one
// (reasonLine), unless it points to a root cause printed above it (vLLM's
// EngineDeadError, and its "Engine core initialization failed. See root
// cause above"): the cause, printed first, stays the reason. Unlike note,
// it scans every line, also once the engine served (engines fail while
// serving); a line without "Error: " or "Exception: " costs two searches.
func (e *engine) noteReason(line string) {
	if !strings.Contains(line, "Error: ") && !strings.Contains(line, "Exception: ") {
		return
	}
	if r := reasonLine.FindString(line); r != "" && !strings.Contains(r, "root cause") {
		e.reason.Store(&r)
	}
}

// said is the reason the engine gave (noteReason); "" when none.
func (e *engine) said() string {
	if r := e.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// lastOutput is what an error message says of the engine's output: the
// reason it gave (noteReason), if any, and its last lines.
func (e *engine) lastOutput() string {
	out := "last output: " + e.logs.Tail(5)
	if r := e.said(); r != "" {
		out = "reason: " + r + "; " + out
	}
	return out
}

// printed reports whether the exited engine printed a line of kind bit.
// Call it once the engine's group is stopped: it waits (bounded) for the
// engine's last output lines.
func (e *engine) printed(bit uint32) bool {
	select {
	case <-e.h.Exited():
	default:
		return false
	}
	e.awaitOutput()
	return e.noted.Load()&bit != 0
}

// DropOwnPoll is why an engine output line is left out of the log
// (Observer.EngineLogDropped): it is the access-log line of one of poold's
// own polls of the engine (proc.OwnPoll).
const DropOwnPoll = "own_poll"

// outputLog is where an engine's output lines go: poold's log, at info
// level, but for the access-log lines of poold's own polls, a line a second
// or two that would flood it: those go at debug level, each counted by
// dropped (nil counts none), unless keepPolls.
type outputLog struct {
	log       *slog.Logger
	keepPolls bool
	dropped   func()
}

// with is o with args added to its log's records.
func (o outputLog) with(args ...any) outputLog {
	o.log = o.log.With(args...)
	return o
}

// line logs one output line; poll says it is one of poold's own polls.
func (o outputLog) line(line string, poll bool) {
	if poll && !o.keepPolls {
		if o.dropped != nil {
			o.dropped()
		}
		o.log.Debug(EngineOutput, EngineLine, line)
		return
	}
	o.log.Info(EngineOutput, EngineLine, line)
}

// pump copies the engine's output lines into the log and its kept lines
// (proc.Output.Pump), noting the kinds poold acts on and the engine's
// reason, until every writer (the engine and its descendants) has closed
// the pipe. The kept lines, which say why the engine failed, never hold
// poold's own polls, nor are those a reason.
func (e *engine) pump(r io.ReadCloser, out outputLog) {
	defer close(e.pumped)
	defer r.Close()
	err := e.logs.Pump(r, func(line string, poll bool) {
		e.note(line)
		if !poll {
			e.noteReason(line)
		}
		out.line(line, poll)
	})
	if err != nil {
		out.log.Warn("reading the engine's output", "err", err)
	}
}
