package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// runnerConfig has a generative profile, preloaded, and a pooling one, on
// one pool that swaps at once (minResidency 0s), both run by the simulator.
const runnerConfig = `{
  "pools": [{"name": "a", "gpus": [0], "default": "chat"}],
  "defaults": {"stopTimeout": "5s", "startupTimeout": "20s", "minResidency": "0s"},
  "profiles": [
    {"id": "chat", "model": "m", "command": ["{poold}", "engine-sim", "/models/chat", "--port", "{port}", "--served-model-name", "{id}", "--runner", "generate"]},
    {"id": "embed", "model": "m", "command": ["{poold}", "engine-sim", "/models/embed", "--port", "{port}", "--served-model-name", "{id}", "--runner", "pooling"]}
  ]
}`

// runnerHandler serves runnerConfig with pools that run, once "chat" is
// ready; the pools stop when the test ends.
func runnerHandler(t *testing.T) (*Handler, *pool.Set) {
	t.Helper()
	cfg, err := profile.Parse([]byte(runnerConfig))
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pools := pool.NewSet(cfg, pool.Options{Launch: profile.Launch{Self: self}})
	ctx, cancel := context.WithCancel(context.Background())
	pools.Run(ctx)
	t.Cleanup(func() {
		cancel()
		pools.Wait()
	})
	h := New(cfg, pools, Options{})
	t.Cleanup(h.Close)
	deadline := time.Now().Add(30 * time.Second)
	for st := pools.Pool("a").Status(); !(st.State == statusapi.StateReady && st.Engine != nil); st = pools.Pool("a").Status() {
		if time.Now().After(deadline) {
			t.Fatalf("chat not ready in 30s: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return h, pools
}

// A route that the model's kind (its engine's --runner) does not serve is
// poold's 404 route_not_served, naming the routes it does serve, before any
// pool is asked: the loaded engine stays, and none is started.
func TestRouteNotServedCostsNoSwap(t *testing.T) {
	h, pools := runnerHandler(t)
	before := pools.Pool("a").Status()

	if rec := serve(h, "POST", "/v1/chat/completions", `{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`); rec.Code != http.StatusOK {
		t.Fatalf("chat to a generative model: %d %s", rec.Code, rec.Body)
	}
	for _, tt := range []struct {
		path, model     string
		serves, missing string // a route the message names, one it must not
	}{
		{"/v1/chat/completions", "embed", "/v1/embeddings", "/v1/messages"},
		{"/v1/messages", "embed", "/v2/rerank", "/v1/completions"},
		{"/pools/a/v1/responses", "embed", "/tokenize", "/v1/responses"},
		{"/v1/embeddings", "chat", "/v1/chat/completions", "/pooling"},
		{"/rerank", "chat", "/v1/messages", "/v1/score"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "POST", tt.path, strings.NewReader(`{"model": "`+tt.model+`", "input": "hi"}`)))
		cancel()
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s for %s: %d %s, want 404", tt.path, tt.model, rec.Code, rec.Body)
			continue
		}
		e := apiError(t, rec)
		_, served, _ := strings.Cut(e.Message, "it serves")
		if e.Code != "route_not_served" || e.Type != "not_found_error" || !strings.Contains(e.Message, `model "`+tt.model+`"`) ||
			!strings.Contains(served, tt.serves) || strings.Contains(served, tt.missing) {
			t.Errorf("%s for %s: %+v", tt.path, tt.model, e)
		}
	}
	after := pools.Pool("a").Status()
	if after.Profile == nil || *after.Profile != "chat" || after.SwitchingTo != nil || after.Engine == nil ||
		after.Engine.PID != before.Engine.PID || len(after.Sleeping) != 0 || len(after.Waiting) != 0 {
		t.Fatalf("the pool changed: before %+v, after %+v", before, after)
	}
}
