package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// saturationHandler serves adminConfig's pools (built, never run) with
// fill as Options.EngineStats.
func saturationHandler(t *testing.T, fill func([]statusapi.Pool)) *Handler {
	t.Helper()
	cfg, err := profile.Parse([]byte(adminConfig))
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, pool.NewSet(cfg, pool.Options{}), Options{EngineStats: fill})
}

func get(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func TestStatusShowsEngineStats(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	h := saturationHandler(t, func(ps []statusapi.Pool) {
		for i := range ps {
			if ps[i].Name == "a" {
				ps[i].EngineStats = &statusapi.EngineStats{Running: 3, Waiting: 1, KVCacheUsage: 0.5, SampledAt: at}
			}
		}
	})
	rec := get(h, "/status")
	var st statusapi.Poold
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /status: %d %v", rec.Code, err)
	}
	if len(st.Pools) != 2 {
		t.Fatalf("%d pools in /status, want 2", len(st.Pools))
	}
	a, b := st.Pools[0].EngineStats, st.Pools[1].EngineStats
	if a == nil || a.Running != 3 || a.Waiting != 1 || a.KVCacheUsage != 0.5 || !a.SampledAt.Equal(at) || a.PrefixCacheHitRate != nil {
		t.Errorf("pool a: engineStats %+v, want the sample given", a)
	}
	if b != nil {
		t.Errorf("pool b: engineStats %+v, want null", b)
	}
}

func TestSaturation(t *testing.T) {
	h := saturationHandler(t, nil) // pools a and b, maxQueue 256 (the default)
	cfg := h.cfg.Load()
	busy := func(name string, inFlight, queued int, st *statusapi.EngineStats) statusapi.Pool {
		return statusapi.Pool{Name: name, InFlight: inFlight, Waiting: map[string]int{"m": queued}, EngineStats: st}
	}
	for _, tt := range []struct {
		name string
		pool statusapi.Pool
		want []string // reasons
	}{
		{"idle, no stats", busy("a", 0, 0, nil), nil},
		{"busy, no stats", busy("a", 3, 2, nil), nil},
		{"busy, engine fine", busy("a", 8, 0, &statusapi.EngineStats{Running: 8, Waiting: 10, KVCacheUsage: 0.95}), nil},
		{"engine queues", busy("a", 20, 0, &statusapi.EngineStats{Running: 9, Waiting: 11, KVCacheUsage: 0.5}), []string{saturatedEngineWaiting}},
		{"KV cache full", busy("a", 1, 0, &statusapi.EngineStats{Running: 1, KVCacheUsage: 0.96}), []string{saturatedKVCache}},
		{"both", busy("a", 30, 0, &statusapi.EngineStats{Waiting: 25, KVCacheUsage: 1}), []string{saturatedEngineWaiting, saturatedKVCache}},
		{"no demand: a saturated engine does not count", busy("a", 0, 0, &statusapi.EngineStats{Waiting: 25, KVCacheUsage: 1}), nil},
		{"poold's queue full", busy("b", 0, 256, nil), []string{saturatedQueue}},
		{"poold's queue nearly full", busy("b", 0, 255, nil), nil},
	} {
		got := h.saturation([]statusapi.Pool{tt.pool}, cfg)
		var reasons []string
		for _, s := range got {
			reasons = append(reasons, s.Reason)
			if s.Pool != tt.pool.Name || s.Message == "" {
				t.Errorf("%s: %+v names no pool or says nothing", tt.name, s)
			}
		}
		if !slices.Equal(reasons, tt.want) {
			t.Errorf("%s: reasons %v, want %v", tt.name, reasons, tt.want)
		}
	}

	// The thresholds are settings.
	h.opts.ReadyMaxEngineWaiting, h.opts.ReadyMaxKVCacheUsage = 2, 0.5
	if got := h.saturation([]statusapi.Pool{busy("a", 3, 0, &statusapi.EngineStats{Waiting: 3, KVCacheUsage: 0.6})}, cfg); len(got) != 2 {
		t.Errorf("with thresholds 2 and 0.5: %+v, want both reasons", got)
	}
}

func TestReadyEndpoint(t *testing.T) {
	var saturated atomic.Bool
	h := saturationHandler(t, func(ps []statusapi.Pool) {
		if saturated.Load() {
			ps[0].InFlight = 12
			ps[0].EngineStats = &statusapi.EngineStats{Running: 1, Waiting: 11, KVCacheUsage: 0.2}
		}
	})
	ready := func(wantCode int, wantStatus string) statusapi.Ready {
		t.Helper()
		rec := get(h, "/ready")
		var body statusapi.Ready
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != wantCode || body.Status != wantStatus ||
			rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("GET /ready: %d %s (%v); want %d and status %q", rec.Code, rec.Body.String(), err, wantCode, wantStatus)
		}
		return body
	}
	ready(http.StatusOK, "ready")
	saturated.Store(true)
	if body := ready(http.StatusServiceUnavailable, "saturated"); len(body.Saturated) != 1 || body.Saturated[0].Pool != "a" || body.Saturated[0].Reason != saturatedEngineWaiting {
		t.Errorf("saturated body %+v, want pool a, engine_waiting", body)
	}
	if rec := get(h, "/health"); rec.Code != http.StatusOK {
		t.Errorf("/health %d while saturated, want 200: it is liveness only", rec.Code)
	}
	saturated.Store(false)
	ready(http.StatusOK, "ready")
	h.Drain()
	ready(http.StatusServiceUnavailable, "draining")
}

// A degraded daemon (its usage ledger does not write) stays ready, 200,
// with the reasons on /ready as on /health.
func TestReadyWhileDegraded(t *testing.T) {
	cfg, err := profile.Parse([]byte(adminConfig))
	if err != nil {
		t.Fatal(err)
	}
	reason := "usage ledger rows are not being written (3 wait in the spool): database or disk is full"
	h := New(cfg, pool.NewSet(cfg, pool.Options{}), Options{Degraded: func() []string { return []string{reason} }})
	for _, path := range []string{"/ready", "/health"} {
		rec := get(h, path)
		var body struct {
			Status  string
			Reasons []string
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK || body.Status != "degraded" ||
			len(body.Reasons) != 1 || body.Reasons[0] != reason {
			t.Errorf("GET %s: %d %s; want 200, degraded, the reason", path, rec.Code, rec.Body)
		}
	}
	h.Drain()
	if rec := get(h, "/ready"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), reason) {
		t.Errorf("GET /ready while draining: %d %s; want 503 with the reason", rec.Code, rec.Body)
	}
}
