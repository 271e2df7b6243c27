package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// shape is one kind of request a workload sends.
type shape struct {
	path   string // "/v1/chat/completions"
	body   []byte
	stream bool
}

// chat is a chat completion of maxTokens tokens for model. A stream does not
// ask for usage: through poold, that is the path where poold asks the engine
// for it and withholds the usage chunk.
func chat(model string, maxTokens int, stream bool) shape {
	b := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":%d,"stream":%t}`, model, maxTokens, stream)
	return shape{path: "/v1/chat/completions", body: []byte(b), stream: stream}
}

// sample is one request's outcome.
type sample struct {
	lat    time.Duration // until the body was read to its end
	ttfb   time.Duration // until the response headers (plain) or the first data event (stream)
	chunks int           // data events other than [DONE] and a usage-only chunk
	usage  bool          // a usage object was seen (in the body, or a usage-only chunk)
	err    error
}

// result aggregates the samples of one closed-loop run.
type result struct {
	wall     time.Duration
	n        int
	errs     int
	firstErr error
	usage    int // requests that saw usage
	chunks   int64
	lat      []time.Duration // successful requests only, sorted
	ttfb     []time.Duration // successful requests only, sorted
}

func (r *result) add(s sample) {
	r.n++
	if s.err != nil {
		r.errs++
		if r.firstErr == nil {
			r.firstErr = s.err
		}
		return
	}
	if s.usage {
		r.usage++
	}
	r.chunks += int64(s.chunks)
	r.lat = append(r.lat, s.lat)
	r.ttfb = append(r.ttfb, s.ttfb)
}

func (r *result) merge(o *result) {
	r.n += o.n
	r.errs += o.errs
	if r.firstErr == nil {
		r.firstErr = o.firstErr
	}
	r.usage += o.usage
	r.chunks += o.chunks
	r.lat = append(r.lat, o.lat...)
	r.ttfb = append(r.ttfb, o.ttfb...)
}

func (r *result) perSecond(n int64) float64 { return float64(n) / r.wall.Seconds() }

// quantile returns the q-quantile of sorted ds (nearest rank), or 0.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds)) + 0.5)
	return ds[min(max(i-1, 0), len(ds)-1)]
}

// newClient is a client for one target that keeps a connection per worker.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// closedLoop runs conc workers against base, each sending its next request as
// soon as its last one ended, until dur has passed (when dur > 0) and, when
// total > 0, until total requests have been sent. Every loop is bounded by ctx.
func closedLoop(ctx context.Context, c *http.Client, base string, sh shape, conc int, dur time.Duration, total int) result {
	var sent atomic.Int64
	deadline := time.Now().Add(dur)
	parts := make([]result, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range conc {
		wg.Add(1)
		go func(r *result) {
			defer wg.Done()
			for ctx.Err() == nil {
				if total > 0 && sent.Add(1) > int64(total) {
					return
				}
				if total == 0 && !time.Now().Before(deadline) {
					return
				}
				r.add(do(ctx, c, base, sh))
			}
		}(&parts[i])
	}
	wg.Wait()
	var all result
	all.wall = time.Since(start)
	for i := range parts {
		all.merge(&parts[i])
	}
	slices.Sort(all.lat)
	slices.Sort(all.ttfb)
	return all
}

var (
	dataPrefix = []byte("data: ")
	doneData   = []byte("data: [DONE]")
	usageOnly  = []byte(`"choices":[],`)
	usageKey   = []byte(`"usage":{`)
)

// do sends one request and reads its answer to the end.
func do(ctx context.Context, c *http.Client, base string, sh shape) sample {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+sh.path, bytes.NewReader(sh.body))
	if err != nil {
		return sample{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return sample{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return sample{err: fmt.Errorf("status %d: %s", resp.StatusCode, b)}
	}
	var s sample
	if !sh.stream {
		s.ttfb = time.Since(start)
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return sample{err: fmt.Errorf("reading body: %w", err)}
		}
		s.usage = bytes.Contains(b, usageKey)
		s.lat = time.Since(start)
		return s
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, dataPrefix) {
			continue
		}
		if s.ttfb == 0 {
			s.ttfb = time.Since(start)
		}
		switch {
		case bytes.Equal(line, doneData):
			done = true
		case bytes.Contains(line, usageOnly) && bytes.Contains(line, usageKey):
			s.usage = true
		default:
			s.chunks++
		}
	}
	if err := sc.Err(); err != nil {
		return sample{err: fmt.Errorf("reading stream: %w", err)}
	}
	if !done {
		return sample{err: fmt.Errorf("stream ended without [DONE] after %d chunks", s.chunks)}
	}
	s.lat = time.Since(start)
	return s
}
