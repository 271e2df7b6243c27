package fleet

import (
	"cmp"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

func (h *host) statusView(now time.Time) statusapi.Host {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := statusapi.Host{
		Name: h.spec.Name, URL: h.spec.URL, Source: h.source, Labels: h.spec.Labels, Weight: h.spec.Weight,
		// A host whose last poll timed out may be paused: not healthy.
		Healthy: h.healthyLocked() && h.silentPolls == 0, Reachable: h.reachable, Ejected: h.eject.active(),
		EjectedFor:   h.eject.cause,
		PollFailures: h.pollFails, ForwardFailures: h.fwdFails,
		PollLatencyMs: float64(h.pollLatency.Microseconds()) / 1000,
		Version:       h.status.Version, Pools: h.status.Pools,
	}
	if h.eject.active() {
		t := h.eject.until
		st.EjectedUntil = &t
	}
	if !h.lastPoll.IsZero() {
		t := h.lastPoll
		st.LastPoll = &t
	}
	if h.lastErr != "" {
		e := h.lastErr
		st.LastError = &e
	}
	if st.Pools == nil {
		st.Pools = []statusapi.Pool{}
	}
	roots := make(map[string]bool)
	for root := range h.health {
		roots[root] = true
	}
	for root, e := range h.itls {
		if e.value(now) > 0 {
			roots[root] = true
		}
	}
	for _, root := range slices.Sorted(maps.Keys(roots)) {
		mh := statusapi.ModelHealth{Model: root, Health: Healthy.String(), SuccessRatio: 1,
			ITLMs: float64(h.itls[root].value(now).Microseconds()) / 1000}
		if m := h.health[root]; m != nil {
			mh.SuccessRatio, mh.Answers = m.ratio(now)
			if hs, ok := m.health(now); ok {
				mh.Health = hs.String()
			} else {
				mh.Health = "ejected"
			}
			if m.eject.active() {
				t := m.eject.until
				mh.EjectedUntil = &t
			}
		}
		st.Models = append(st.Models, mh)
	}
	return st
}

// Status returns the fleet view, hosts sorted by name.
func (f *Fleet) Status() ([]statusapi.Host, statusapi.File) {
	hosts := f.snapshot()
	now := f.opts.Now()
	out := make([]statusapi.Host, 0, len(hosts))
	for _, name := range slices.Sorted(maps.Keys(hosts)) {
		out = append(out, hosts[name].statusView(now))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return out, f.fstat
}

func (h *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	hosts, file := h.fleet.Status()
	st := statusapi.Fleetd{Version: h.opts.Version, HostsFile: file, Hosts: hosts}
	if h.opts.Tenants != nil {
		tf, limits := h.opts.Tenants.Status()
		st.TenantsFile, st.TenantLimits = &tf, &limits
	}
	writeJSON(w, st)
}

// stateRank orders model states, best first.
func stateRank(s string) int {
	switch s {
	case "ready":
		return 0
	case "loading":
		return 1
	case "sleeping":
		return 2
	}
	return 3
}

// serveModels lists every name any healthy host serves, with the hosts; for
// a tenant, only the models it may use.
func (h *Handler) serveModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, statusapi.ModelList[statusapi.FleetModel]{Object: "list", Data: h.models(tenant.FromContext(r.Context()))})
}

// serveModel answers GET /v1/models/{id} (the SDKs' models.retrieve) with
// the name's entry of GET /v1/models, or a 404 model_not_found (also for a
// model that the tenant may not use).
func (h *Handler) serveModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	t := tenant.FromContext(r.Context())
	for _, m := range h.models(t) {
		if m.ID == name {
			writeJSON(w, m)
			return
		}
	}
	openai.WriteError(w, r, http.StatusNotFound, "model_not_found", "model", h.unknownModel(h.fleet.snapshot(), name, t))
}

// models is the entries of GET /v1/models, sorted by name: each name any
// healthy host serves, in its best state, with the smallest max_model_len a
// host gives (a request within it fits wherever it goes); for a tenant t
// (nil: anyone), only the models it may use.
func (h *Handler) models(t *tenant.Tenant) []statusapi.FleetModel {
	hosts := h.fleet.snapshot()
	entries := make(map[string]*statusapi.FleetModel)
	created := h.fleet.opts.Now().Unix()
	for _, name := range slices.Sorted(maps.Keys(hosts)) {
		hs := hosts[name]
		if !hs.healthy() {
			continue
		}
		for _, m := range hs.modelList() {
			if t != nil && !t.AllowsModel(m.ID, m.Root) {
				continue
			}
			e := entries[m.ID]
			if e == nil {
				e = &statusapi.FleetModel{ModelObject: statusapi.ModelObject{ID: m.ID, Object: "model", Created: created, OwnedBy: "fleetd", Root: m.Root}, State: m.State}
				entries[m.ID] = e
			}
			if stateRank(m.State) < stateRank(e.State) {
				e.State = m.State
			}
			if m.MaxModelLen > 0 && (e.MaxModelLen == 0 || m.MaxModelLen < e.MaxModelLen) {
				e.MaxModelLen = m.MaxModelLen
			}
			e.Hosts = append(e.Hosts, statusapi.ModelHost{Name: name, State: m.State, Pools: m.Pools})
		}
	}
	data := make([]statusapi.FleetModel, 0, len(entries))
	for _, id := range slices.Sorted(maps.Keys(entries)) {
		data = append(data, *entries[id])
	}
	return data
}

// modelList returns the host's models sorted by name.
func (h *host) modelList() []hostModel {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Collect(maps.Values(h.models))
	slices.SortFunc(out, func(a, b hostModel) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// modelNames lists every name the healthy hosts serve that t (nil: anyone)
// may use, sorted.
func modelNames(hosts map[string]*host, t *tenant.Tenant) []string {
	set := make(map[string]bool)
	for _, h := range hosts {
		if !h.healthy() {
			continue
		}
		for _, m := range h.modelList() {
			if t == nil || t.AllowsModel(m.ID, m.Root) {
				set[m.ID] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}
