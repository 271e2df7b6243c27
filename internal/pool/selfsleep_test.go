package pool

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// idleSleepProfile is profile id run by the simulator, which puts itself
// to sleep at level after 200 ms without a request (--sim-idle-sleep);
// sleep is the profile's sleep setting (nil: none) and env its environment.
func idleSleepProfile(id string, level int, sleep any, env map[string]string) string {
	cmd := []string{"{poold}", "engine-sim", "/models/" + id, "--port", "{port}", "--served-model-name", "{id}",
		"--enable-sleep-mode", "--sim-idle-sleep", "200ms", "--sim-idle-sleep-level", strconv.Itoa(level)}
	b, _ := json.Marshal(map[string]any{"id": id, "model": "m", "command": cmd, "sleep": sleep, "env": env})
	return string(b)
}

// engineSleeps asks the engine on port whether it sleeps (GET /is_sleeping).
func engineSleeps(t *testing.T, port int) bool {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/is_sleeping")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("GET /is_sleeping: %s: %q", resp.Status, b)
	}
	return v.IsSleeping
}

// waitEngineSleeps polls until the engine on port says it sleeps, failing
// after 20 s.
func waitEngineSleeps(t *testing.T, port int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !engineSleeps(t, port); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the engine did not fall asleep by itself within 20s")
		}
	}
}

func (o *exitObserver) selfSleeps() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.selfSlept)
}

// An engine that falls asleep by itself, told by its metrics, is taken for
// a sleeper, and the next request wakes it through poold's wake path
// before it gets its lease: whether the profile enables sleep or only
// serves the sleep endpoints, at either level.
func TestEngineAsleepByItselfIsWokenForTheNextRequest(t *testing.T) {
	dev := map[string]string{profile.DevModeEnv: "1"}
	for _, tt := range []struct {
		name string
		prof string
	}{
		{"sleep level 1", idleSleepProfile("x", 1, map[string]any{"level": 1}, nil)},
		{"sleep level 2", idleSleepProfile("x", 2, map[string]any{"level": 2}, nil)},
		{"no sleep setting, the endpoints served", idleSleepProfile("x", 1, nil, dev)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := reloadConfig(t, sleepPool, tt.prof)
			obs := &exitObserver{}
			var logs logSink
			s, _ := runSleepSet(t, cfg, Options{Observer: obs, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			st := waitFor(t, s, "a", "x ready", readyWith("x"))
			pid, port := st.Engine.PID, st.Engine.Port
			waitEngineSleeps(t, port)

			s.EngineAsleep("a", pid+1, port, 1) // another engine's: ignored
			s.EngineAsleep("b", pid, port, 1)   // no such pool
			if got := s.Pool("a").Status(); got.State != StateReady.String() || len(got.Sleeping) != 0 {
				t.Fatalf("told of another engine: state %s, sleeping %+v; want ready, none", got.State, got.Sleeping)
			}
			level := map[bool]int{true: 2, false: 1}[strings.Contains(tt.name, "level 2")]
			s.EngineAsleep("a", pid, port, level)
			st = waitFor(t, s, "a", "x a sleeper", func(st statusapi.Pool) bool {
				return st.State == StateEmpty.String() && len(st.Sleeping) == 1
			})
			if sl := st.Sleeping[0]; sl.Profile != "x" || sl.PID != pid || sl.Level != level || !sl.SelfSlept {
				t.Errorf("sleeper %+v; want x, pid %d, level %d, selfSlept", sl, pid, level)
			}
			if got := obs.selfSleeps(); !slices.Equal(got, []string{SelfSleepWake}) {
				t.Errorf("EngineSelfSlept %v, want [wake]", got)
			}

			// The lease comes once poold woke it: no request of the
			// client's ever reaches it asleep.
			l := acquire(t, s, cfg, "x")
			defer l.Release()
			st = s.Pool("a").Status()
			if st.State != StateReady.String() || st.Engine == nil || st.Engine.PID != pid || len(st.Sleeping) != 0 {
				t.Fatalf("leased: state %s, engine %+v, sleeping %+v; want ready on pid %d, none asleep", st.State, st.Engine, st.Sleeping, pid)
			}
			// The engine's own account: poold's /wake_up ("woke up") woke
			// it, not a request that reached it asleep ("woke up for a
			// request", the simulator's own wake).
			const slept, woken, own = "sleeping after idle time", `msg=\"woke up\"`, "woke up for a request"
			for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), woken); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the engine logged no /wake_up within 20s of the lease:\n%s", logs.String())
				}
			}
			out := logs.String()
			if i, j, k := strings.Index(out, slept), strings.Index(out, woken), strings.Index(out, own); i < 0 || i > j || k >= 0 && k < j {
				t.Errorf("the engine's log has its idle sleep at %d, poold's wake at %d, its own wake at %d: want sleep, then poold's wake first", i, j, k)
			}
		})
	}
}

// An engine that says it sleeps but serves no sleep endpoints (no dev
// mode) cannot be woken by poold: it is reported once and keeps serving.
func TestEngineAsleepWithoutEndpointsIsReported(t *testing.T) {
	cfg := reloadConfig(t, sleepPool, idleSleepProfile("x", 1, nil, nil))
	obs := &exitObserver{}
	s, _ := runSleepSet(t, cfg, Options{Observer: obs})
	st := waitFor(t, s, "a", "x ready", readyWith("x"))
	pid, port := st.Engine.PID, st.Engine.Port
	// Without dev mode, /is_sleeping is 404: wait for the idle sleep in
	// the metrics instead.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `sleep_state="awake"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine did not fall asleep by itself within 20s")
		}
	}
	for range 2 {
		s.EngineAsleep("a", pid, port, 1)
	}
	if got := obs.selfSleeps(); !slices.Equal(got, []string{SelfSleepNone}) {
		t.Errorf("EngineSelfSlept %v, want [none] (once)", got)
	}
	if st := s.Pool("a").Status(); st.State != StateReady.String() || len(st.Sleeping) != 0 || st.Engine == nil || st.Engine.PID != pid {
		t.Errorf("state %s, engine %+v, sleeping %+v; want x still serving", st.State, st.Engine, st.Sleeping)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := s.Acquire(ctx, cfg.Lookup("x"), "", Caller{}, nil)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	l.Release()
}
