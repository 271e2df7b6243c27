package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/poold/poold/internal/gpu"
	"github.com/poold/poold/internal/pool"
)

// Status is the body of GET /status (DESIGN.md §6): the daemon-wide part comes
// from Options.Status, the pools from the pool set.
type Status struct {
	Version string        `json:"version"`
	Host    string        `json:"host"`
	Config  ConfigStatus  `json:"config"`
	GPU     GPUStatus     `json:"gpu"`
	Pools   []pool.Status `json:"pools"`
}

// ConfigStatus describes the profiles file in force.
type ConfigStatus struct {
	Path      string    `json:"path"`
	SHA256    string    `json:"sha256"`
	LoadedAt  time.Time `json:"loadedAt"`
	LastError *string   `json:"lastError"`
}

// GPUStatus says whether GPU telemetry is available, and if not, why; when it
// is, Devices is every GPU's telemetry.
type GPUStatus struct {
	Available bool         `json:"available"`
	Reason    string       `json:"reason,omitempty"`
	Devices   []gpu.Device `json:"devices,omitempty"`
}

func (h *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	var st Status
	if h.opts.Status != nil {
		st = h.opts.Status()
	}
	st.Pools = h.PoolStatus()
	for i := range st.Pools {
		for _, d := range gpu.Select(st.GPU.Devices, st.Pools[i].GPUs) {
			st.Pools[i].GPUMemory = append(st.Pools[i].GPUMemory, pool.GPUMemoryStat{Index: d.Index, UsedBytes: d.MemoryUsedBytes, TotalBytes: d.MemoryTotalBytes})
		}
	}
	writeJSON(w, st)
}

// serveEngineMetrics passes the pool's engine's own /metrics (vLLM's vllm:*)
// through, so that Prometheus can scrape engines that listen only on loopback.
// A pool without an engine answers 503.
func (h *Handler) serveEngineMetrics(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("pool")
	p := h.pools.Pool(name)
	if p == nil {
		writeError(w, http.StatusNotFound, "pool_not_found", "", fmt.Sprintf("no pool %q", name))
		return
	}
	eng := p.Status().Engine
	if eng == nil {
		writeError(w, http.StatusServiceUnavailable, "no_engine", "", fmt.Sprintf("pool %q runs no engine", name))
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(eng.Port)+"/metrics", nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal_error", "", err.Error())
		return
	}
	for _, k := range []string{"Accept", "Accept-Encoding", "X-Prometheus-Scrape-Timeout-Seconds"} {
		if v := r.Header.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := h.rp.Transport.RoundTrip(req)
	if err != nil {
		writeError(w, http.StatusBadGateway, "engine_unavailable", "", fmt.Sprintf("engine of pool %q: %v", name, err))
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

// PoolStatus snapshots every pool, in file order.
func (h *Handler) PoolStatus() []pool.Status {
	ps := h.pools.Pools()
	out := make([]pool.Status, len(ps))
	for i, p := range ps {
		out[i] = p.Status()
	}
	return out
}

func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]string{"status": "ok"})
}

// modelEntry is one entry of GET /v1/models: the OpenAI model object plus
// poold's view of where it runs.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is the canonical profile id the name resolves to.
	Root string `json:"root"`
	// State is "ready" where it serves now, "loading" while it starts, else
	// "available".
	State string   `json:"state"`
	Pools []string `json:"pools"`
}

// serveModels lists every servable name (ids and aliases), loaded or not.
func (h *Handler) serveModels(w http.ResponseWriter, r *http.Request) {
	state := make(map[string]string)
	for _, st := range h.PoolStatus() {
		if st.SwitchingTo != nil {
			state[*st.SwitchingTo] = "loading"
		}
		if st.Profile != nil {
			state[*st.Profile] = "ready"
		}
	}
	cfg := h.cfg.Load()
	names := cfg.Names()
	data := make([]modelEntry, 0, len(names))
	for _, name := range names {
		prof := cfg.Lookup(name)
		s := state[prof.ID]
		if s == "" {
			s = "available"
		}
		data = append(data, modelEntry{ID: name, Object: "model", Created: h.created, OwnedBy: "poold", Root: prof.ID, State: s, Pools: prof.Pools})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
