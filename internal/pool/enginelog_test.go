package pool

import (
	"strconv"
	"strings"
	"testing"

	"github.com/poold/poold/internal/shim"
)

func TestNoteLines(t *testing.T) {
	for _, tt := range []struct {
		line string
		want uint32
	}{
		{"OSError: [Errno 98] Address already in use", notePortTaken},
		{"ERROR 11-30 12:00:00 [api_server.py:1] Port 8000 is already in use", notePortTaken},
		{"listen tcp 127.0.0.1:8000: bind: address already in use", notePortTaken},
		{"PORT 41873 IS ALREADY IN USE", notePortTaken},
		{"ValueError: Free memory on device cuda:0 (8.00/10.00 GiB) on startup is less than desired GPU memory utilization (0.9, 9.00 GiB).", noteMemoryShort},
		{"INFO: the port is already in use by nobody", 0},
		{"Loading safetensors checkpoint shards: 100%", 0},
	} {
		e := &engine{}
		e.note(tt.line)
		if got := e.noted.Load(); got != tt.want {
			t.Errorf("%q: noted %b, want %b", tt.line, got, tt.want)
		}
		// Once it served, an engine's lines are no longer scanned.
		e = &engine{}
		e.served.Store(true)
		if e.note(tt.line); e.noted.Load() != 0 {
			t.Errorf("%q, printed by an engine that served: noted %b", tt.line, e.noted.Load())
		}
	}
}

func TestNoteReason(t *testing.T) {
	for _, tt := range []struct{ line, want string }{
		{"(EngineCore pid=7) ERROR 04-07 10:00:00 [core.py:1120] RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1",
			"RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1"},
		{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
		{"ValueError: Free memory on device cuda:0 (8.00/10.00 GiB) on startup is less than desired GPU memory utilization (0.9, 9.00 GiB).",
			"ValueError: Free memory on device cuda:0 (8.00/10.00 GiB) on startup is less than desired GPU memory utilization (0.9, 9.00 GiB)."},
		// Pointers to a cause above, not the cause.
		{"(APIServer pid=6) ERROR [async_llm.py:525] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.", ""},
		{"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}", ""},
		{"(EngineCore pid=7) ERROR 04-07 10:00:00 [core.py:1120] Traceback (most recent call last):", ""},
		{"time=2025-01-01T00:00:00Z level=ERROR msg=\"engine core is dead\"", ""},
		{"INFO: 127.0.0.1:4242 - \"POST /v1/chat/completions HTTP/1.1\" 500 Internal Server Error", ""},
	} {
		e := &engine{}
		e.served.Store(true) // a serving engine's lines are scanned too
		e.noteReason(tt.line)
		got := ""
		if r := e.reason.Load(); r != nil {
			got = *r
		}
		if got != tt.want {
			t.Errorf("%q: reason %q, want %q", tt.line, got, tt.want)
		}
	}
}

// An engine printing a line far over shim.MaxLine, then more, keeps its
// pipe: every line is read (the long one cut and marked), and the engine
// exits on its own, not of SIGPIPE.
func TestPumpSurvivesLongLines(t *testing.T) {
	e := exitedEngine(t, "head -c 200000 /dev/zero | tr '\\0' x; echo; echo after; exit 7 # {port}")
	msg := e.failure().Error()
	if !strings.Contains(msg, "exit status 7") || !strings.Contains(msg, " … [line truncated: "+strconv.Itoa(200000-shim.MaxLine)+" more bytes] | after") {
		t.Fatalf("failure %.300q…: want exit status 7 and the truncated line followed by the next", msg)
	}
}
