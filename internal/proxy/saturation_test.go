package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
