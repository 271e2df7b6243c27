package engine

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
)

// The HTTP calls poold makes to an engine on loopback: the readiness and
// health probes, the sleep-mode calls and the warm-up.

// ProbeTimeout bounds one probe of the default probe client.
const ProbeTimeout = 2 * time.Second

// warmupTimeout bounds the warm-up probe after a wake: a 1-token answer of
// an awake engine takes milliseconds, while vLLM queues a request to an
// engine not fully awake until it is, which may be never.
const warmupTimeout = 10 * time.Second

// Clients are the HTTP clients of poold's calls to its engines, as
// NewClients makes them. A nil client fails its calls.
type Clients struct {
	Probe   *http.Client // readiness and health probes, each with its own timeout
	Control *http.Client // sleep, wake and warm-up calls, bounded by their contexts
}

// NewClients is Clients of probe and control, where a nil probe is a
// client whose requests time out after ProbeTimeout and a nil control a
// client without a timeout.
func NewClients(probe, control *http.Client) Clients {
	if probe == nil {
		probe = &http.Client{Timeout: ProbeTimeout}
	}
	if control == nil {
		control = &http.Client{}
	}
	return Clients{Probe: probe, Control: control}
}

// At is the API of the engine that serves on 127.0.0.1:port.
func (c Clients) At(port int) API {
	return API{base: "http://127.0.0.1:" + strconv.Itoa(port), c: c}
}

// API is one engine's HTTP API, as Clients.At makes it. The zero API has
// no address and fails every call.
type API struct {
	base string // http://127.0.0.1:port
	c    Clients
}

// Health probes GET /health and returns the status it answered, or the
// transport's error (status 0).
func (a API) Health(ctx context.Context) (int, error) {
	resp, err := a.do(ctx, a.c.Probe, http.MethodGet, "/health", "")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Serves reports whether the engine's /v1/models lists id, and when it
// does not, what it found instead.
func (a API) Serves(ctx context.Context, id string) (ok bool, seen string) {
	resp, err := a.do(ctx, a.c.Probe, http.MethodGet, "/v1/models", "")
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
		if m.ID == id {
			return true, ""
		}
		ids = append(ids, strconv.Quote(m.ID))
	}
	return false, fmt.Sprintf("it lists [%s], not %q (check --served-model-name)", strings.Join(ids, ", "), id)
}

// IsSleeping asks the engine whether it sleeps (GET /is_sleeping).
func (a API) IsSleeping(ctx context.Context) (bool, error) {
	_, b, err := a.call(ctx, http.MethodGet, "/is_sleeping", "")
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

// Sleep puts the engine to sleep at level and confirms it with
// /is_sleeping. The caller has drained it: vLLM's sleep aborts the
// requests in flight by default, and mode=wait (which versions before it
// ignore) would let any still running finish.
func (a API) Sleep(ctx context.Context, level int) error {
	if _, _, err := a.call(ctx, http.MethodPost, "/sleep?level="+strconv.Itoa(level)+"&mode=wait", ""); err != nil {
		return err
	}
	asleep, err := a.IsSleeping(ctx)
	if err == nil && !asleep {
		err = errors.New("GET /is_sleeping: still awake after /sleep")
	}
	return err
}

// Wake wakes an engine asleep at level: the wake calls (wakeCalls), then
// /is_sleeping, which must say it is fully awake (else a request would
// only queue). Its readiness and a warm-up are the caller's to check.
func (a API) Wake(ctx context.Context, level int) error {
	for _, c := range wakeCalls(level) {
		if _, _, err := a.call(ctx, http.MethodPost, c.path, c.body); err != nil {
			return err
		}
	}
	asleep, err := a.IsSleeping(ctx)
	if err == nil && asleep {
		err = errors.New("GET /is_sleeping: still asleep after the wake")
	}
	return err
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

// WarmUp runs model id once, bounded by warmupTimeout: a 1-token
// completion, or, where the engine serves no completions (404: vLLM
// registers them only for generative models), an embedding of the same
// text, as a pooling model serves. Any answer but a 5xx passes: a 4xx
// still comes from a live engine (a reranker that serves neither route
// answers 404 to both).
func (a API) WarmUp(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	defer cancel()
	name, _ := json.Marshal(id)
	status, _, err := a.call(ctx, http.MethodPost, "/v1/completions", `{"model":`+string(name)+`,"prompt":"warm-up","max_tokens":1}`)
	if status == http.StatusNotFound {
		status, _, err = a.call(ctx, http.MethodPost, "/v1/embeddings", `{"model":`+string(name)+`,"input":"warm-up"}`)
	}
	if err != nil && (status == 0 || status >= 500) {
		return fmt.Errorf("warm-up probe: %w", err)
	}
	return nil
}

// call sends one control request and returns the status and (the start
// of) the body. It fails on a transport error (status 0) or a status
// other than 2xx, naming the path and the engine's answer.
func (a API) call(ctx context.Context, method, path, body string) (int, []byte, error) {
	resp, err := a.do(ctx, a.c.Control, method, path, body)
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

// do sends method path with body (JSON, when there is one) through c.
func (a API) do(ctx context.Context, c *http.Client, method, path, body string) (*http.Response, error) {
	if c == nil {
		return nil, errNoClient
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.Do(req)
}

// errNoClient fails the calls of the zero API.
var errNoClient = errors.New("no client for the engine's API")
