package engine

import (
	"bufio"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/poold/poold/internal/shim"
)

// Output is what poold keeps of an engine's output as it reads it: the last
// lines, but the access-log lines of poold's own polls of the engine
// (OwnPoll), which would push out the lines that say why it failed. Make
// one with NewOutput; a nil *Output keeps nothing and tails "(none)".
type Output struct {
	max   int        // how many lines are kept
	mu    sync.Mutex // guards lines
	lines []string
}

// NewOutput is an Output that keeps the last keep lines (none when keep
// is not positive).
func NewOutput(keep int) *Output { return &Output{max: keep} }

// Pump reads r line by line to its end (every writer closed the pipe), and
// calls each, in order, with every line and whether it is one of poold's own
// polls (OwnPoll); the lines that are not are kept first. It never stops
// reading before the end: an engine writing into a pipe nobody reads would
// block, and one whose pipe was closed would die of SIGPIPE. A line longer
// than shim.MaxLine is cut there and says how much was dropped
// (shim.ReadLine). Pump returns nil at the end, or the error that ended the
// read; closing r is the caller's.
func (o *Output) Pump(r io.Reader, each func(line string, poll bool)) error {
	br := bufio.NewReaderSize(r, shim.MaxLine)
	for {
		line, err := shim.ReadLine(br)
		if line != "" || err == nil {
			poll := OwnPoll(line)
			if !poll {
				o.Add(line)
			}
			each(line, poll)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Add keeps line as the last one, dropping the first kept once there are
// as many as the Output keeps.
func (o *Output) Add(line string) {
	if o == nil || o.max <= 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.lines) == o.max {
		copy(o.lines, o.lines[1:])
		o.lines = o.lines[:o.max-1]
	}
	o.lines = append(o.lines, line)
}

// Tail returns the last n lines kept joined by " | ", or "(none)".
func (o *Output) Tail(n int) string {
	if o == nil {
		return "(none)"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lines[max(0, len(o.lines)-n):]
	if len(l) == 0 {
		return "(none)"
	}
	return strings.Join(l, " | ")
}

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

// OwnPoll reports whether line is the access-log line of a GET of one of
// the paths poold itself polls its engines on (/v1/models, /health,
// /is_sleeping, /metrics), whatever its query and status.
func OwnPoll(line string) bool {
	if !strings.Contains(line, "GET /") {
		return false // most lines, cheaply
	}
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = colours.ReplaceAllString(line, "")
	}
	m := accessLine.FindStringSubmatch(line)
	return m != nil && slices.Contains(ownPolls, m[1])
}
