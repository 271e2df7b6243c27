package proxy

import (
	"encoding/json"
	"net/http"
	"time"

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

// GPUStatus says whether GPU telemetry is available, and if not, why.
type GPUStatus struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

func (h *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	var st Status
	if h.opts.Status != nil {
		st = h.opts.Status()
	}
	st.Pools = h.PoolStatus()
	writeJSON(w, st)
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
	names := h.cfg.Names()
	data := make([]modelEntry, 0, len(names))
	for _, name := range names {
		prof := h.cfg.Lookup(name)
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
