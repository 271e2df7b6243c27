package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/upstream"
)

// modifyResponse decides what an answer means: a refusal that started
// nothing (a key refused, poold's X-Poold-Refused) is retried on the next
// host when there is one; a 5xx counts against the model on the host; a
// success counts once its body ended. It names the host in X-Fleet-Host
// and watches the body (first byte, chunk gaps, a cut).
func (h *Handler) modifyResponse(resp *http.Response) error {
	a := resp.Request.Context().Value(attemptKey{}).(*attempt)
	h.fleet.forwarded(a.host, nil)
	code := resp.StatusCode
	refused := resp.Header.Get(openai.RefusedHeader)
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		// The key, not the host, decides: another host may accept it.
		a.host.refuseKey(a.cred, a.now())
		a.settle(h.fleet, neutral)
		if a.nextAny {
			a.retry = "key"
			return errRetry
		}
	case code == http.StatusServiceUnavailable && (refused == "queue_full" || refused == "queue_budget"):
		// Load shed at arrival: not a failure, and only a host where the
		// model is awake or loading may take it (a retry must not load
		// another copy).
		a.settle(h.fleet, neutral)
		if a.nextWarm {
			a.retry = "full"
			return errRetry
		}
	case code == http.StatusServiceUnavailable && refused != "":
		a.settle(h.fleet, failure)
		if a.nextAny {
			a.retry = "refused"
			return errRetry
		}
	case code >= 500:
		a.settle(h.fleet, failure) // never retried: it may have started a load, or the work itself
	case code >= 300:
		a.settle(h.fleet, success) // the host answered; the request was at fault
	}
	a.status = code
	resp.Header.Set("X-Fleet-Host", a.host.name)
	resp.Header.Del("X-Request-Id") // the answer has it already; poold's would be a second copy
	resp.Header.Del(openai.RefusedHeader)
	if a.limited {
		// The client's limits are the fleet's, which fleetd set; a host
		// with the same tenants file counts only what reached it.
		for k := range resp.Header {
			if strings.HasPrefix(k, "X-Ratelimit-") {
				delete(resp.Header, k)
			}
		}
	}
	wb := &watchedBody{ReadCloser: resp.Body, h: h, a: a, ok: code < 300}
	switch {
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		wb.stream = true
		sse := openai.NewSSEReader(wb, a.withhold, nil)
		sse.SetMaxEvent(int(h.opts.MaxEventBytes))
		if a.anthropic {
			sse.SetAnthropic()
		}
		sse.OnEvent(upstream.IdleByEvents(resp.Body))
		resp.Body = sse
		if a.meter {
			a.sse = sse
		}
	case a.meter:
		a.tail = openai.NewUsageReader(wb, nil)
		resp.Body = a.tail
	default:
		resp.Body = wb
	}
	return nil
}

// usage is what the attempt's answer used, as the host reported it; for a
// stream cut short, the estimate of its prompt and the chunks the client
// got (estimated); for another 2xx
// answer without usage, the estimate of its prompt and the chunks of text a
// stream carried (0 for a plain body); zero for no attempt, or one whose
// answer was not metered.
func (a *attempt) usage() (u openai.Usage, estimated bool) {
	switch {
	case a == nil || a.sse == nil && a.tail == nil:
		return u, false
	case a.sse != nil:
		if u, ok := a.sse.Usage(); ok {
			return u, false
		}
		u.CompletionTokens = a.sse.ContentChunks()
		if !a.sse.Ended() {
			// Cut or abandoned: its prompt was made whatever the client got.
			u.PromptTokens = a.prompt
			return u, true
		}
	default:
		if u, ok := a.tail.Usage(); ok {
			return u, false
		}
	}
	if a.status/100 != 2 {
		return openai.Usage{}, false
	}
	u.PromptTokens = a.prompt
	return u, true
}

// upstreamError handles an attempt that got no response: the host is
// skipped for the next one, or, on the last attempt, the client gets a 502
// (a 504 when the host went silent).
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	a := r.Context().Value(attemptKey{}).(*attempt)
	if errors.Is(err, errRetry) || a.client.Err() != nil {
		return // a refusal to retry, or the client left
	}
	silent := errors.Is(context.Cause(r.Context()), errSilent)
	if silent {
		err = errSilent // the host was ejected for it already
	} else {
		h.fleet.forwarded(a.host, err)
	}
	h.log.Warn("host request failed", "host", a.host.name, "request_id", a.id, "err", err)
	// Another host gets the request only if this one cannot have run it: not
	// a byte of it was written (a refused dial, a closed connection), or the
	// host went silent and was ejected for it (the retry of silent hosts,
	// which a setting turns off). A host that read the request and then
	// failed may have done its GPU work: the client is told instead.
	_, notSent := errors.AsType[*upstream.NotSentError](err)
	if a.nextAny && (notSent || silent) {
		a.retry = "connect"
		if silent {
			a.retry = "silent"
		}
		return
	}
	a.status = http.StatusBadGateway
	code := "host_unavailable"
	if silent {
		a.status, code = http.StatusGatewayTimeout, "host_silent"
	}
	w.Header().Set("X-Fleet-Host", a.host.name)
	w.Header().Set("X-Request-Id", a.id)
	openai.WriteError(w, r, a.status, code, "", fmt.Sprintf("host %q failed: %v", a.host.name, err))
}

// minChunks is how many chunks a stream needs for its mean gap to be a
// sample of the host's inter-token latency.
const minChunks = 3

// watchedBody watches an answer on its way to the client: its first byte,
// the gaps between a stream's chunks (the host's inter-token latency, as
// fleetd sees it), and its end: complete, or cut by the host.
type watchedBody struct {
	io.ReadCloser
	h      *Handler
	a      *attempt
	ok     bool // a 2xx, whose end is a success
	stream bool

	first, last time.Time
	chunks      int
	ended       bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil || err == io.EOF:
	case errors.Is(err, upstream.ErrBodyIdle):
		b.h.log.Warn("host stalled while answering", "host", b.a.host.name, "request_id", b.a.id, "err", err)
		err = &openai.StreamError{Status: http.StatusGatewayTimeout, Code: "host_timeout",
			Message: fmt.Sprintf("host %q stalled: %v", b.a.host.name, err)}
	case b.a.client.Err() == nil:
		// The host broke the answer off (it died, or its connection did):
		// the stream's error event says so, in fleetd's words.
		b.h.log.Warn("host failed while answering", "host", b.a.host.name, "request_id", b.a.id, "err", err)
		err = &openai.StreamError{Status: http.StatusBadGateway, Code: "host_failed",
			Message: fmt.Sprintf("host %q failed while answering: %v", b.a.host.name, err)}
	}
	if n > 0 {
		now := b.a.now()
		if b.chunks == 0 {
			b.first = now
			b.a.markFirst(now)
		}
		b.chunks++
		b.last = now
	}
	if err != nil && !b.ended {
		b.ended = true
		b.end(err)
	}
	return n, err
}

func (b *watchedBody) end(err error) {
	a := b.a
	switch {
	case err == io.EOF:
		if b.ok {
			a.settle(b.h.fleet, success)
		}
		if b.ok && b.stream && b.chunks >= minChunks {
			a.host.observeITL(a.root, b.last.Sub(b.first)/time.Duration(b.chunks-1), b.last)
		}
	case a.client.Err() == nil:
		a.cut = true
		a.settle(b.h.fleet, failure)
	}
}

func (a *attempt) markFirst(now time.Time) {
	a.first = now
	a.host.answered(a)
}
