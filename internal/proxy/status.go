package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

func (h *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	var st statusapi.Poold
	if h.opts.Status != nil {
		st = h.opts.Status()
	}
	st.Pools = h.PoolStatus()
	pool.FillGPUMemory(st.Pools, st.GPU.Devices)
	writeJSON(w, st)
}

// serveEngineMetrics passes the pool's engine's own /metrics (vLLM's vllm:*)
// through, so that Prometheus can scrape engines that listen only on loopback.
// A pool without an engine answers 503.
func (h *Handler) serveEngineMetrics(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("pool")
	p := h.pools.Pool(name)
	if p == nil {
		openai.WriteError(w, r, http.StatusNotFound, "pool_not_found", "", h.unknownPool(name))
		return
	}
	eng := p.Status().Engine
	if eng == nil {
		openai.WriteError(w, r, http.StatusServiceUnavailable, "no_engine", "", fmt.Sprintf("pool %q runs no engine", name))
		return
	}
	req, err := engineGet(r.Context(), eng.Port, "/metrics")
	if err != nil {
		openai.WriteError(w, r, http.StatusInternalServerError, "internal_error", "", err.Error())
		return
	}
	for _, k := range []string{"Accept", "Accept-Encoding", "X-Prometheus-Scrape-Timeout-Seconds"} {
		if v := r.Header.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		openai.WriteError(w, r, http.StatusBadGateway, "engine_unavailable", "", fmt.Sprintf("engine of pool %q: %v", name, err))
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Content-Encoding"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		h.log.Debug("passing engine metrics through", "pool", name, "err", err)
	}
}

// PoolStatus snapshots every pool, in file order (pool.Set.Status), with
// its engine's stats (Options.EngineStats).
func (h *Handler) PoolStatus() []statusapi.Pool {
	out := h.pools.Status()
	if h.opts.EngineStats != nil {
		h.opts.EngineStats(out)
	}
	return out
}

// serveHealth is poold's liveness: 200, or 503 once a shutdown drains. A
// daemon that serves with something wrong (Options.Degraded) answers 200
// with status "degraded" and the reasons.
func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "draining"})
		return
	}
	if h.opts.Degraded != nil {
		if reasons := h.opts.Degraded(); len(reasons) > 0 {
			// Still live and serving: 200, with the reasons.
			writeJSON(w, map[string]any{"status": "degraded", "reasons": reasons})
			return
		}
	}
	writeJSON(w, map[string]string{"status": "ok"})
}

// visibleNames are the model names (ids and aliases) there are for ten: all
// of them for nil, those ten may use otherwise.
func (h *Handler) visibleNames(ten *tenant.Tenant) []string {
	cfg := h.cfg.Load()
	names := cfg.Names()
	if ten == nil {
		return names
	}
	return slices.DeleteFunc(names, func(n string) bool { return !ten.AllowsModel(n, cfg.Lookup(n).ID) })
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
