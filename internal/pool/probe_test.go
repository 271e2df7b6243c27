package pool

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
)

// fakeEngine is an engine whose HTTP side is an httptest server: it records
// every call ("POST /path?query body") and answers each with answer (200
// and an empty object when answer is nil or returns 0). /v1/models lists
// the profile's id.
type fakeEngine struct {
	*engine
	answer func(call string) (status int, body string)

	mu    sync.Mutex // guards calls
	calls []string
}

func newFakeEngine(t *testing.T, id string, answer func(call string) (int, string)) *fakeEngine {
	t.Helper()
	f := &fakeEngine{answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		call := r.Method + " " + r.URL.RequestURI()
		if len(b) > 0 {
			call += " " + string(b)
		}
		f.mu.Lock()
		f.calls = append(f.calls, call)
		f.mu.Unlock()
		status, body := 0, ""
		if f.answer != nil {
			status, body = f.answer(call)
		}
		if status == 0 && r.URL.Path == "/v1/models" {
			status, body = http.StatusOK, `{"object":"list","data":[{"id":"`+id+`","object":"model"}]}`
		}
		if status == 0 {
			status, body = http.StatusOK, "{}"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	f.engine = &engine{
		profile: &profile.Profile{ID: id},
		logs:    proc.NewOutput(logLines),
	}
	f.port, _ = strconv.Atoi(port)
	f.api = proc.NewClients(nil, nil).At(f.port)
	f.h = servedAt(f.port)
	return f
}

// recorded returns the calls so far, the readiness probes left out.
func (f *fakeEngine) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(f.calls), func(c string) bool { return c == "GET /v1/models" })
}

// Sleep is sent with mode=wait, and a wake follows vLLM's documented order:
// at level 2 the weights, their reload, then the KV cache.
func TestSleepAndWakeCalls(t *testing.T) {
	warm := `POST /v1/completions {"model":"m","prompt":"warm-up","max_tokens":1}`
	for _, tt := range []struct {
		level int
		want  []string
	}{
		{1, []string{"POST /sleep?level=1&mode=wait", "GET /is_sleeping", "POST /wake_up", "GET /is_sleeping", warm}},
		{2, []string{"POST /sleep?level=2&mode=wait", "GET /is_sleeping",
			"POST /wake_up?tags=weights", `POST /collective_rpc {"method":"reload_weights"}`, "POST /wake_up?tags=kv_cache", "POST /reset_prefix_cache", "GET /is_sleeping", warm}},
	} {
		asleep := false
		f := newFakeEngine(t, "m", func(call string) (int, string) {
			switch call {
			case "GET /is_sleeping":
				return http.StatusOK, `{"is_sleeping":` + strconv.FormatBool(asleep) + `}`
			case "POST /sleep?level=1&mode=wait", "POST /sleep?level=2&mode=wait":
				asleep = true
			case "POST /wake_up", "POST /wake_up?tags=kv_cache":
				asleep = false
			}
			return 0, ""
		})
		ctx := context.Background()
		if err := f.api.Sleep(ctx, tt.level); err != nil {
			t.Fatalf("level %d: sleep: %v", tt.level, err)
		}
		if err := f.wakeUp(ctx, tt.level, 10*time.Second); err != nil {
			t.Fatalf("level %d: wake: %v", tt.level, err)
		}
		if got := f.recorded(); !slices.Equal(got, tt.want) {
			t.Errorf("level %d: calls\n%q\nwant\n%q", tt.level, got, tt.want)
		}
	}
}

// An engine that is not fully awake after the wake calls (its /is_sleeping
// still true) queues every request, as vLLM does, so the warm-up would
// only wait: the wake fails at once instead.
func TestWakeFailsFastWhenStillAsleep(t *testing.T) {
	f := newFakeEngine(t, "m", func(call string) (int, string) {
		if call == "GET /is_sleeping" {
			return http.StatusOK, `{"is_sleeping":true}`
		}
		return 0, ""
	})
	err := f.wakeUp(context.Background(), 1, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "still asleep after the wake") {
		t.Fatalf("wake: %v; want it to fail as still asleep", err)
	}
	if got := f.recorded(); !slices.Equal(got, []string{"POST /wake_up", "GET /is_sleeping"}) {
		t.Fatalf("calls %q: the warm-up was sent to a sleeping engine", got)
	}
}
