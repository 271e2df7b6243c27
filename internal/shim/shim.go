// Package shim is an engine's supervisor, `poold engine-shim`: a small
// process between poold and one engine, which lets the engine outlive a
// poold that restarts and stops it when no poold comes back.
//
// poold starts one shim per engine, and the shim starts the engine as its
// own child. The shim reads the engine's output to its end (an engine
// never blocks on a full pipe, nor dies of SIGPIPE, whatever poold does),
// keeps its last lines, and serves a Unix socket through which one poold at
// a time is attached: to each poold that attaches it sends a hello, then
// every output line as the engine prints it, and last the engine's exit.
// While no poold is attached for the adopt timeout, from the shim's start or
// from the last poold's going, the shim stops the engine and exits: no
// engine runs for longer than that without a poold in front of it.
//
// The protocol goes both ways: poold asks its shim, over the same
// connection, to stop the engine (Conn.Stop), to signal it (Conn.Signal) or
// to say its state (Conn.State); poold never signals a process that a shim
// holds itself. Each Request carries an ID, and the shim answers it with a
// KindReply of the same ID among the lines.
//
// This package is the protocol and both of its ends: Serve (the shim's) and
// Attach (poold's). Starting and stopping the engine's processes is the
// caller's (internal/pool), through Engine.
package shim

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// Protocol is the version of the messages. A poold attaches only to a shim
// that speaks its version (a *ProtocolError otherwise): after an upgrade
// that changes it, the engines of the old shims are loaded afresh. Version
// 1 only reported; version 2 takes Requests.
const Protocol = 2

// The kinds of Message.
const (
	// KindHello is the first message to each poold that attaches.
	KindHello = "hello"
	// KindLine is one output line of the engine.
	KindLine = "line"
	// KindExit is the engine's exit, the last message.
	KindExit = "exit"
	// KindFailed says that the engine could not be started: the only
	// message, in place of the hello.
	KindFailed = "failed"
	// KindReply answers the Request of the same ID.
	KindReply = "reply"
)

// The operations of a Request.
const (
	// OpStop stops every process of the engine under the stop contract:
	// SIGTERM, Request.Grace, SIGKILL. The reply comes once the stop has
	// begun; the exit follows.
	OpStop = "stop"
	// OpSignal sends Request.Signal to every process of the engine.
	OpSignal = "signal"
	// OpState asks for the engine's state: its pid, and whether it runs.
	OpState = "state"
)

// Request is what a poold asks of its shim, one JSON object per line.
type Request struct {
	// ID is echoed in the reply; a poold numbers its requests from 1.
	ID int    `json:"id"`
	Op string `json:"op"`
	// Grace is an OpStop's wait between SIGTERM and SIGKILL; negative: the
	// shim's own (Options.Grace).
	Grace time.Duration `json:"grace,omitempty"`
	// Signal is an OpSignal's signal number.
	Signal int `json:"signal,omitempty"`
}

// Message is what a shim sends to the poold attached to it, one JSON object
// per line. Which fields are set depends on Kind.
type Message struct {
	Kind string `json:"kind"`
	// Protocol, PID, ShimPID, Fingerprint, Backlog and Unseen are a
	// hello's: the shim's protocol version, the engine's pid, the shim's own
	// (a SIGTERM to it stops the engine), the fingerprint of the
	// engine's command and environment that the poold starting it gave
	// (Options.Fingerprint), the engine's last output lines (oldest first),
	// and how many of those, the last ones, no poold has received: they
	// were printed while none was attached.
	Protocol    int      `json:"protocol,omitempty"`
	PID         int      `json:"pid,omitempty"`
	ShimPID     int      `json:"shimPid,omitempty"`
	Fingerprint string   `json:"fingerprint,omitempty"`
	Backlog     []string `json:"backlog,omitempty"`
	Unseen      int      `json:"unseen,omitempty"`
	// Grace is a hello's too: the shim's own stop grace (Options.Grace).
	Grace time.Duration `json:"grace,omitempty"`
	// Line is a KindLine's line, without its line end.
	Line string `json:"line,omitempty"`
	// Status is why the engine ended (KindExit: "exit status 1", "signal:
	// killed"; empty when it exited with 0) or could not start (KindFailed).
	Status string `json:"status,omitempty"`
	// ID, Error, Running and Stopping are a reply's: the request's ID, why
	// it failed (empty when it did not), and for OpState (with PID) whether
	// the engine's main process runs and whether a stop is under way. An
	// engine that exited is reported by the exit, after which the shim
	// answers nothing.
	ID       int    `json:"id,omitempty"`
	Error    string `json:"error,omitempty"`
	Running  bool   `json:"running,omitempty"`
	Stopping bool   `json:"stopping,omitempty"`
}

// MaxLine bounds the part of one engine output line that is kept and sent;
// the rest of a longer line (a prompt logged by vLLM's
// --enable-log-requests, say) is read and dropped.
const MaxLine = 16 * 1024

// ReadLine reads one line, without its line end (LF or CRLF), keeping at
// most br's buffer size of it and marking a longer one truncated. At the
// end of the input it returns the last, unterminated line, if any, with
// io.EOF.
func ReadLine(br *bufio.Reader) (string, error) {
	b, err := br.ReadSlice('\n')
	line := string(b)
	dropped := 0
	for err == bufio.ErrBufferFull {
		b, err = br.ReadSlice('\n')
		dropped += len(b)
	}
	if dropped == 0 {
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	} else if err == nil { // the line end is the last of what was dropped
		dropped -= len(b) - len(bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r")))
	}
	if dropped > 0 {
		line += " … [line truncated: " + strconv.Itoa(dropped) + " more bytes]"
	}
	return line, err
}

// Fingerprint identifies an engine's command line and environment without
// holding either (an environment may hold secrets): a poold adopts an engine
// only when the profile in force would start it with the same fingerprint.
func Fingerprint(argv, env []string) string {
	h := sha256.New()
	for _, list := range [][]string{argv, env} {
		h.Write([]byte(strconv.Itoa(len(list)) + "\n"))
		for _, s := range list {
			h.Write([]byte(strconv.Itoa(len(s)) + ":" + s))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
