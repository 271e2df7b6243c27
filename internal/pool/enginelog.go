package pool

import (
	"bufio"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"

	"github.com/poold/poold/internal/shim"
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
	out := "last output: " + e.logs.tail(5)
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
	case <-e.exited:
	default:
		return false
	}
	e.awaitOutput()
	return e.noted.Load()&bit != 0
}

// DropOwnPoll is why an engine output line is left out of the log
// (Observer.EngineLogDropped): it is the access-log line of one of poold's
// own polls of the engine.
const DropOwnPoll = "own_poll"

// ownPolls are the paths poold itself GETs from its engines: /v1/models
// (readiness, and a model's max_model_len), /health (liveness),
// /is_sleeping (sleep mode) and /metrics (their load, and
// GET /pools/{pool}/metrics).
var ownPolls = []string{"/v1/models", "/health", "/is_sleeping", "/metrics"}

// accessLine matches the access-log line of a GET as vLLM's HTTP server
// (uvicorn) prints it, colours taken out: the prefix vLLM gives its
// processes' lines, if any ("(APIServer pid=1234) "), "INFO:", the client's
// address, the request line and the status. The path, without its query,
// is the first group.
var accessLine = regexp.MustCompile(`^(?:\([^)]*\) )?INFO: +\S+ - "GET ([^ ?"]*)(?:\?[^ "]*)? HTTP/[0-9.]+" [0-9]{3}\b`)

// colours matches the ANSI colour codes of a line printed in colour.
var colours = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// ownPoll reports whether line is the access-log line of a GET of one of
// ownPolls, whatever its query and status.
func ownPoll(line string) bool {
	if !strings.Contains(line, "GET /") {
		return false // most lines, cheaply
	}
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = colours.ReplaceAllString(line, "")
	}
	m := accessLine.FindStringSubmatch(line)
	return m != nil && slices.Contains(ownPolls, m[1])
}

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

// pump copies the engine's output lines into the log and the ring, noting
// the kinds poold acts on and the engine's reason, until every writer (the engine and its
// descendants) has closed the pipe. It never stops reading before: an
// engine writing into a pipe nobody reads would block, and one whose pipe
// was closed would die of SIGPIPE. A line longer than shim.MaxLine is cut
// there and says how much was dropped. The ring, whose lines say why the
// engine failed, never holds poold's own polls: they would push those out.
func (e *engine) pump(r io.ReadCloser, out outputLog) {
	defer close(e.pumped)
	defer r.Close()
	br := bufio.NewReaderSize(r, shim.MaxLine)
	for {
		line, err := shim.ReadLine(br)
		if line != "" || err == nil {
			e.note(line)
			poll := ownPoll(line)
			if !poll {
				e.noteReason(line)
				e.logs.add(line)
			}
			out.line(line, poll)
		}
		if err != nil {
			if err != io.EOF {
				out.log.Warn("reading the engine's output", "err", err)
			}
			return
		}
	}
}
