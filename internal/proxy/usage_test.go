package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
)

// brokenBody returns its text, then err.
type brokenBody struct {
	r   io.Reader
	err error
}

func (b *brokenBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, b.err
	}
	return n, err
}

func (b *brokenBody) Close() error { return nil }

const threeEvents = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n"

// stream is an exchange whose SSE reader was read to the end of body.
func stream(t *testing.T, body string, err error) *exchange {
	t.Helper()
	x := &exchange{lease: &pool.Lease{}, body: make([]byte, 400)}
	x.sse = openai.NewSSEReader(&brokenBody{r: strings.NewReader(body), err: err}, false, nil)
	_, _ = io.Copy(io.Discard, x.sse)
	return x
}

func chatRequest(gone bool) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.SetPathValue("path", "chat/completions")
	if gone {
		ctx, cancel := context.WithCancel(r.Context())
		cancel()
		r = r.WithContext(ctx)
	}
	return r
}

func TestAccountOutcomes(t *testing.T) {
	lease := &pool.Lease{CausedSwap: true}
	cases := []struct {
		name   string
		rec    metrics.Record
		x      *exchange
		gone   bool
		want   string
		tokens [2]int // estimated prompt and completion tokens; zero: none
	}{
		{"complete stream", metrics.Record{Status: 200}, stream(t, threeEvents, io.EOF), false, metrics.OutcomeOK, [2]int{100, 2}},
		{"complete stream, client gone after", metrics.Record{Status: 200}, stream(t, threeEvents, io.EOF), true, metrics.OutcomeOK, [2]int{100, 2}},
		{"engine broke off", metrics.Record{Status: 200}, stream(t, threeEvents, errors.New("unexpected EOF")), false, metrics.OutcomeCut, [2]int{100, 2}},
		{"client left mid-stream", metrics.Record{Status: 200}, stream(t, threeEvents, context.Canceled), true, metrics.OutcomeAborted, [2]int{100, 2}},
		{"client left while queued", metrics.Record{Status: 499}, &exchange{}, true, metrics.OutcomeAborted, [2]int{}},
		{"queue full", metrics.Record{Status: 503}, &exchange{}, false, metrics.OutcomeRejected, [2]int{}},
		{"unknown model", metrics.Record{Status: 404}, &exchange{}, false, metrics.OutcomeError, [2]int{}},
		{"engine 503", metrics.Record{Status: 503}, &exchange{lease: lease}, false, metrics.OutcomeError, [2]int{}},
	}
	for _, c := range cases {
		rec := c.rec
		account(&rec, c.x, chatRequest(c.gone))
		if rec.Outcome != c.want {
			t.Errorf("%s: outcome %q, want %q", c.name, rec.Outcome, c.want)
		}
		est := c.tokens != [2]int{}
		if rec.TokensEstimated != est || [2]int{rec.PromptTokens, rec.CompletionTokens} != c.tokens {
			t.Errorf("%s: tokens %d/%d estimated %v, want %v estimated %v", c.name, rec.PromptTokens, rec.CompletionTokens, rec.TokensEstimated, c.tokens, est)
		}
	}
}

func TestAccountKeepsReportedUsage(t *testing.T) {
	x := stream(t, threeEvents+"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n", io.EOF)
	x.lease = &pool.Lease{CausedSwap: true}
	rec := metrics.Record{Status: 200, Counted: true, PromptTokens: 7, CompletionTokens: 2}
	account(&rec, x, chatRequest(false))
	if rec.TokensEstimated || rec.PromptTokens != 7 || rec.CompletionTokens != 2 || !rec.CausedSwap || rec.Outcome != metrics.OutcomeOK {
		t.Errorf("got %+v", rec)
	}
}
