package proxy

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/poold/poold/internal/openai"
)

// broken is an upstream body that fails after its parts.
type broken struct{ parts }

func (b *broken) Read(p []byte) (int, error) {
	n, err := b.parts.Read(p)
	if err == io.EOF {
		err = errors.New("connection reset by peer")
	}
	return n, err
}

// An exchange succeeded when the engine answered 2xx and the answer
// completed, a stream with generated text: what tells the pool that its
// engine served (Lease.Succeeded).
func TestExchangeSucceeded(t *testing.T) {
	deadCore := `data: {"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	plain := func(status int, body string) *exchange {
		return &exchange{status: status, tail: openai.NewUsageReader(&parts{p: []string{body}}, nil)}
	}
	stream := func(src io.ReadCloser) *exchange {
		return &exchange{status: http.StatusOK, sse: openai.NewSSEReader(src, false, nil)}
	}
	for _, tc := range []struct {
		name       string
		x          *exchange
		clientGone bool
		want       bool
	}{
		{"plain 200", plain(http.StatusOK, `{"choices":[]}`), false, true},
		{"plain 500", plain(http.StatusInternalServerError, `{"error":{}}`), false, false},
		{"stream with text", stream(&parts{p: []string{chunkRole, chunkToken, "data: [DONE]\n\n"}}), false, true},
		{"stream of a dead core", stream(&parts{p: []string{deadCore, "data: [DONE]\n\n"}}), false, false},
		{"stream cut", stream(&broken{parts{p: []string{chunkRole, chunkToken}}}), false, false},
		{"client gone mid-stream", stream(&parts{p: []string{chunkRole, chunkToken}}), true, false},
	} {
		var r io.Reader = tc.x.sse
		if tc.x.sse == nil {
			r = tc.x.tail
		}
		if tc.clientGone {
			_, _ = r.Read(make([]byte, 4096)) // the first event; the rest is left unread
		} else {
			_, _ = io.Copy(io.Discard, r)
		}
		if got := tc.x.succeeded(tc.clientGone); got != tc.want {
			t.Errorf("%s: succeeded %v, want %v", tc.name, got, tc.want)
		}
	}
}
