package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/openai"
)

// timedStream is an event stream's body as the client reads it: after
// each read, the chunks of generated text the SSE reader passed on since
// the last read (openai.SSEReader.ContentChunks) are timed, at that read.
// A role-only chunk, a usage chunk or a keep-alive comment is not content,
// so time to first token is the first token's.
type timedStream struct {
	*openai.SSEReader
	timing *metrics.StreamTiming
	seen   int // content chunks already timed
}

func (s *timedStream) Read(p []byte) (int, error) {
	n, err := s.SSEReader.Read(p)
	if c := s.ContentChunks(); c != s.seen {
		s.timing.Content(time.Now(), c-s.seen)
		s.seen = c
	}
	return n, err
}

// timeStream starts timing x's stream, read through sse, and returns the
// body to send the client.
func (h *Handler) timeStream(x *exchange, sse *openai.SSEReader) *timedStream {
	var itl prometheus.Observer
	if h.opts.Metrics != nil {
		itl = h.opts.Metrics.ITL(x.lease.Pool, x.lease.Profile.ID, x.client)
	}
	x.timing.Begin(x.start, itl)
	x.timed = timedStream{SSEReader: sse, timing: &x.timing}
	return &x.timed
}
