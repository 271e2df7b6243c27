package engine

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/poold/poold/internal/shim"
)

// The access-log lines of poold's own polls are told from the rest as
// vLLM prints them: uvicorn's line, behind vLLM's process prefix or not, in
// colour or not; a GET of exactly a polled path, with or without a query,
// any status.
func TestOwnPoll(t *testing.T) {
	const colour = "\x1b[1;36m(APIServer pid=1234)\x1b[0;0m \x1b[32mINFO\x1b[0m:     127.0.0.1:56790 - \"\x1b[1mGET /metrics HTTP/1.1\x1b[0m\" \x1b[32m200 OK\x1b[0m"
	for _, tt := range []struct {
		line string
		want bool
	}{
		{`INFO:     127.0.0.1:56790 - "GET /metrics HTTP/1.1" 200 OK`, true},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /health HTTP/1.1" 200 OK`, true},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /v1/models HTTP/1.1" 200 OK`, true},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /is_sleeping HTTP/1.1" 200 OK`, true},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /health HTTP/1.1" 503 Service Unavailable`, true},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /metrics?name[]=vllm:num_requests_running HTTP/1.1" 200 OK`, true},
		{`INFO:     ::1:56790 - "GET /health HTTP/1.0" 200 OK`, true},
		{colour, true},
		{strings.ReplaceAll(colour, "/metrics", "/v1/chat/completions"), false},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "POST /v1/chat/completions HTTP/1.1" 200 OK`, false},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "POST /health HTTP/1.1" 200 OK`, false},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /v1/models/m HTTP/1.1" 200 OK`, false},
		{`(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /healthz HTTP/1.1" 404 Not Found`, false},
		{`(APIServer pid=1234) INFO 12-01 10:00:00 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s`, false},
		{`(APIServer pid=1234) INFO 12-01 10:00:00 [logger.py:40] Received request x: prompt: 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK'`, false},
		{`(APIServer pid=1234) WARNING:  Invalid HTTP request received.`, false},
		{"", false},
	} {
		if got := OwnPoll(tt.line); got != tt.want {
			t.Errorf("%q: own poll %t, want %t", tt.line, got, tt.want)
		}
	}
}

// Pump reads a pipe to its end: every line reaches each in order, told an
// own poll or not; a line over shim.MaxLine is cut and marked, and reading
// goes on after it; the kept lines are the last ones but the polls.
func TestOutputPump(t *testing.T) {
	poll := `INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK`
	long := strings.Repeat("x", shim.MaxLine+100)
	r, w := io.Pipe()
	go func() {
		for _, l := range []string{"one", poll, long, "two\r", poll, "three"} {
			_, _ = io.WriteString(w, l+"\n")
		}
		_, _ = io.WriteString(w, "no line end")
		w.Close()
	}()
	o := NewOutput(3)
	var got []string
	err := o.Pump(r, func(line string, p bool) {
		if p != (line == poll) {
			t.Errorf("%.40q: own poll %t", line, p)
		}
		got = append(got, line)
	})
	if err != nil {
		t.Fatal(err)
	}
	cut := long[:shim.MaxLine] + " … [line truncated: 100 more bytes]"
	if want := []string{"one", poll, cut, "two", poll, "three", "no line end"}; !slices.Equal(got, want) {
		t.Fatalf("lines %.200q, want %.200q", got, want)
	}
	if tail, want := o.Tail(5), "two | three | no line end"; tail != want {
		t.Errorf("Tail(5) = %.200q, want %q (the last 3, no polls)", tail, want)
	}
	if tail := (*Output)(nil).Tail(5); tail != "(none)" {
		t.Errorf("a nil Output tails %q, want (none)", tail)
	}
}

// A read error ends the pump with it.
func TestOutputPumpReadError(t *testing.T) {
	r, w := io.Pipe()
	go func() {
		_, _ = io.WriteString(w, "line\n")
		w.CloseWithError(errors.New("torn"))
	}()
	var got []string
	if err := NewOutput(3).Pump(r, func(line string, _ bool) { got = append(got, line) }); err == nil || err.Error() != "torn" {
		t.Fatalf("Pump = %v, want the read error", err)
	}
	if !slices.Equal(got, []string{"line"}) {
		t.Fatalf("lines %q, want the one before the error", got)
	}
}
