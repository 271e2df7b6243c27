package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
)

// The HTTP calls poold makes to an engine: the readiness probe, and the
// sleep-mode and warm-up calls.

// probeTimeout bounds one readiness probe of the default probe client.
const probeTimeout = 2 * time.Second

// clients are the HTTP clients of a pool's calls to its engines.
type clients struct {
	probe   *http.Client // readiness probes, each with its own timeout
	control *http.Client // sleep, wake and warm-up calls, bounded by their contexts
}

// defaultClients fills in the clients Options leaves nil.
func defaultClients(o Options) clients {
	c := clients{probe: o.ProbeClient, control: o.ControlClient}
	if c.probe == nil {
		c.probe = &http.Client{Timeout: probeTimeout}
	}
	if c.control == nil {
		c.control = &http.Client{}
	}
	return c
}

// waitReady polls /v1/models until the profile's id is listed: every
// proc.PollInterval, 2 ms at first and at most 100 ms. It fails at once if the
// engine exits, and after timeout.
func (e *engine) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	seen := "no answer yet" // what the last probe found
	for {
		select {
		case <-e.h.Exited():
			return fmt.Errorf("while loading: %w", e.failure())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("engine %q not ready after startupTimeout %s: GET /v1/models: %s; %s", e.profile.ID, timeout, seen, e.lastOutput())
			}
			return ctx.Err()
		case <-t.C:
		}
		ok, found := e.serves(ctx)
		if ok {
			return nil
		}
		if ctx.Err() == nil { // a probe cut by the deadline found nothing: keep what the last one did
			seen = found
		}
		t.Reset(proc.PollInterval(time.Since(start), 2*time.Millisecond, 100*time.Millisecond))
	}
}

// serves reports whether the engine's /v1/models lists the profile's id,
// and when it does not, what it found instead.
func (e *engine) serves(ctx context.Context) (ok bool, seen string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base()+"/v1/models", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := e.http.probe.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, "answered " + resp.Status
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return false, "undecodable answer: " + err.Error()
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID == e.profile.ID {
			return true, ""
		}
		ids = append(ids, strconv.Quote(m.ID))
	}
	return false, fmt.Sprintf("it lists [%s], not %q (check --served-model-name)", strings.Join(ids, ", "), e.profile.ID)
}

// warmupTimeout bounds the warm-up probe after a wake: a 1-token answer of
// an awake engine takes milliseconds, while vLLM queues a request to an
// engine not fully awake until it is, which may be never.
const warmupTimeout = 10 * time.Second

// call sends one sleep-mode request to the engine and returns the status and
// (the start of) the body. It fails on a transport error (status 0) or a
// status other than 2xx, naming the path and the engine's answer.
func (e *engine) call(ctx context.Context, method, path, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.base()+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.http.control.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp.StatusCode, b, nil
}

// isSleeping asks the engine whether it sleeps (GET /is_sleeping).
func (e *engine) isSleeping(ctx context.Context) (bool, error) {
	_, b, err := e.call(ctx, http.MethodGet, "/is_sleeping", "")
	if err != nil {
		return false, err
	}
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.IsSleeping == nil {
		return false, fmt.Errorf("GET /is_sleeping: unexpected answer %q", b)
	}
	return *v.IsSleeping, nil
}

// sleep puts the engine to sleep at level and confirms it with /is_sleeping.
// The pool has drained it: vLLM's sleep aborts the requests in flight by
// default, and mode=wait (which versions before it ignore) would let any
// still running finish.
func (e *engine) sleep(ctx context.Context, level int) error {
	if _, _, err := e.call(ctx, http.MethodPost, "/sleep?level="+strconv.Itoa(level)+"&mode=wait", ""); err != nil {
		return err
	}
	asleep, err := e.isSleeping(ctx)
	if err == nil && !asleep {
		err = errors.New("GET /is_sleeping: still awake after /sleep")
	}
	return err
}

// wakeUp wakes a sleeping engine: /wake_up (after level 2 in vLLM's
// documented order, below), /is_sleeping confirming it is fully awake (else
// the warm-up would only queue), the readiness gate, and a 1-token warm-up
// probe that proves it generates. timeout bounds it all.
func (e *engine) wakeUp(ctx context.Context, level int, timeout time.Duration) error {
	select {
	case <-e.h.Exited():
		return fmt.Errorf("died while asleep: %w", e.failure())
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, c := range wakeCalls(level) {
		if _, _, err := e.call(ctx, http.MethodPost, c.path, c.body); err != nil {
			return err
		}
	}
	if asleep, err := e.isSleeping(ctx); err != nil || asleep {
		if err == nil {
			err = errors.New("GET /is_sleeping: still asleep after the wake")
		}
		return err
	}
	if err := e.waitReady(ctx, timeout); err != nil {
		return err
	}
	return e.warmUp(ctx)
}

// wakeCalls are the POSTs that wake an engine asleep at level. At level 2
// the weights were discarded: vLLM documents waking the weights' memory
// alone, reloading them, and only then allocating the KV cache, so that the
// reload does not run beside a full KV cache (a higher peak of GPU memory);
// the prefix cache, whose blocks are gone, is reset last.
func wakeCalls(level int) []struct{ path, body string } {
	if level != 2 {
		return []struct{ path, body string }{{"/wake_up", ""}}
	}
	return []struct{ path, body string }{
		{"/wake_up?tags=weights", ""},
		{"/collective_rpc", `{"method":"reload_weights"}`},
		{"/wake_up?tags=kv_cache", ""},
		{"/reset_prefix_cache", ""},
	}
}

// warmUp runs the model once, bounded by warmupTimeout: a 1-token
// completion, or, where the engine serves no completions (404: vLLM
// registers them only for generative models), an embedding of the same
// text, as a pooling model serves. Any answer but a 5xx passes: a 4xx
// still comes from a live engine (a reranker that serves neither route
// answers 404 to both).
func (e *engine) warmUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	defer cancel()
	id, _ := json.Marshal(e.profile.ID)
	status, _, err := e.call(ctx, http.MethodPost, "/v1/completions", `{"model":`+string(id)+`,"prompt":"warm-up","max_tokens":1}`)
	if status == http.StatusNotFound {
		status, _, err = e.call(ctx, http.MethodPost, "/v1/embeddings", `{"model":`+string(id)+`,"input":"warm-up"}`)
	}
	if err != nil && (status == 0 || status >= 500) {
		return fmt.Errorf("warm-up probe: %w", err)
	}
	return nil
}
