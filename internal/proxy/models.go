package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// serveModels lists every servable name (ids and aliases), loaded or not.
func (h *Handler) serveModels(w http.ResponseWriter, r *http.Request) {
	states := h.modelStates()
	cfg := h.cfg.Load()
	names := h.visibleNames(tenant.FromContext(r.Context()))
	data := make([]statusapi.Model, 0, len(names))
	for _, name := range names {
		data = append(data, h.modelEntry(name, cfg.Lookup(name), states))
	}
	writeJSON(w, statusapi.ModelList[statusapi.Model]{Object: "list", Data: data})
}

// serveModel answers GET /v1/models/{id} (the SDKs' models.retrieve) with
// the name's entry of GET /v1/models, or a 404 model_not_found (also for a
// model the request's tenant may not use). Its max_model_len is the
// profile's maxModelLen, else, while the profile is loaded, its engine's.
func (h *Handler) serveModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	prof := h.cfg.Load().Lookup(name)
	if ten := tenant.FromContext(r.Context()); prof == nil || ten != nil && !ten.AllowsModel(name, prof.ID) {
		openai.WriteError(w, r, http.StatusNotFound, "model_not_found", "model", h.unknownModel(name, ten))
		return
	}
	m := h.modelEntry(name, prof, h.modelStates())
	if m.MaxModelLen == 0 {
		m.MaxModelLen = h.engineMaxModelLen(r.Context(), prof.ID)
	}
	writeJSON(w, m)
}

// modelStates maps each profile id loaded or loading on a pool to its
// state, "ready" or "loading".
func (h *Handler) modelStates() map[string]string {
	state := make(map[string]string)
	for _, st := range h.PoolStatus() {
		if st.SwitchingTo != nil {
			state[*st.SwitchingTo] = "loading"
		}
		if st.Profile != nil {
			state[*st.Profile] = "ready"
		}
	}
	return state
}

// modelEntry is name's entry of GET /v1/models; prof is its profile.
func (h *Handler) modelEntry(name string, prof *profile.Profile, states map[string]string) statusapi.Model {
	s := states[prof.ID]
	if s == "" {
		s = "available"
	}
	return statusapi.Model{
		ModelObject: statusapi.ModelObject{ID: name, Object: "model", Created: h.created, OwnedBy: "poold", Root: prof.ID, MaxModelLen: prof.MaxModelLen},
		State:       s, Pools: prof.Pools,
	}
}

// engineModelsTimeout bounds the question to an engine about its models.
const engineModelsTimeout = 2 * time.Second

// engineGet is a GET of path from the engine on port, on a connection of its
// own: unlike a forwarded request, it knows no engine keep-alive to keep an
// idle connection within (upstream.WithIdleTimeout), and one kept for the
// Transport's default would be closed by the engine first.
func engineGet(ctx context.Context, port int, path string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return nil, fmt.Errorf("asking the engine for %s: %w", path, err)
	}
	req.Close = true
	return req, nil
}

// engineMaxModelLen asks the engine serving profile id, if one does, for
// the max_model_len of its /v1/models entry; 0 when none serves it or the
// engine does not say.
func (h *Handler) engineMaxModelLen(ctx context.Context, id string) int {
	port := 0
	for _, st := range h.PoolStatus() {
		if st.Profile != nil && *st.Profile == id && st.Engine != nil {
			port = st.Engine.Port
			break
		}
	}
	if port == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, engineModelsTimeout)
	defer cancel()
	req, err := engineGet(ctx, port, "/v1/models")
	if err != nil {
		return 0
	}
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		h.log.Debug("asking the engine for its models", "profile", id, "err", err)
		return 0
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list) != nil {
		return 0
	}
	for _, m := range list.Data {
		if m.ID == id {
			return m.MaxModelLen
		}
	}
	return 0
}
