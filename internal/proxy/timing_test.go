package proxy

import (
	"io"
	"testing"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/record"
)

// parts is an upstream body that returns one part per Read.
type parts struct{ p []string }

func (s *parts) Read(b []byte) (int, error) {
	if len(s.p) == 0 {
		return 0, io.EOF
	}
	n := copy(b, s.p[0])
	s.p = s.p[1:]
	return n, nil
}

func (s *parts) Close() error { return nil }

const (
	chunkRole  = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	chunkToken = `data: {"choices":[{"index":0,"delta":{"content":"tok"}}],"usage":null}` + "\n\n"
	chunkUsage = `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}` + "\n\n"
)

// TestTimedStreamCountsContentOnly: the role-only chunk neither starts the
// time to first token nor counts a gap, nor does the usage chunk; chunks
// read together count gaps of zero.
func TestTimedStreamCountsContentOnly(t *testing.T) {
	start := time.Now()
	src := &parts{p: []string{chunkRole, chunkToken, chunkToken + chunkToken, chunkUsage, "data: [DONE]\n\n"}}
	x := &exchange{start: start}
	x.timing.Begin(start, nil)
	x.timed = timedStream{SSEReader: openai.NewSSEReader(src, true, nil), timing: &x.timing}
	buf := make([]byte, 4096)
	if _, err := x.timed.Read(buf); err != nil { // the role chunk
		t.Fatal(err)
	}
	afterRole := time.Since(start)
	if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{&x.timed}, buf); err != nil {
		t.Fatal(err)
	}
	var r record.Request
	x.timing.Record(&r)
	if r.TTFT < afterRole || r.ITLGaps != 2 {
		t.Errorf("TTFT %v (role chunk read by %v), %d gaps; want TTFT from the first token, 2 gaps", r.TTFT, afterRole, r.ITLGaps)
	}
}
