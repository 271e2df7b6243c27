package fleet

import (
	"cmp"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/poold/poold/internal/pool"
)

// Status is the body of fleetd's GET /status: the hosts file and every host
// with its last polled pools. `fleetd status` prints it.
type Status struct {
	Version   string       `json:"version"`
	HostsFile FileStatus   `json:"hostsFile"`
	Hosts     []HostStatus `json:"hosts"`
}

// HostStatus is one host in the fleet view.
type HostStatus struct {
	Name   string            `json:"name"`
	URL    string            `json:"url"`
	Source string            `json:"source"` // "file" or "dns:NAME"
	Labels map[string]string `json:"labels"`
	Weight int               `json:"weight"`
	// Healthy: requests are routed to it (polled, not ejected).
	Healthy   bool `json:"healthy"`
	Reachable bool `json:"reachable"` // the last poll succeeded
	Ejected   bool `json:"ejected"`
	// PollFailures and ForwardFailures count failures in a row.
	PollFailures    int           `json:"pollFailures"`
	ForwardFailures int           `json:"forwardFailures"`
	LastPoll        *time.Time    `json:"lastPoll"`
	PollLatencyMs   float64       `json:"pollLatencyMs"`
	LastError       *string       `json:"lastError"`
	Version         string        `json:"version"`
	Pools           []pool.Status `json:"pools"`
}

func (h *host) statusView() HostStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HostStatus{
		Name: h.spec.Name, URL: h.spec.URL, Source: h.source, Labels: h.spec.Labels, Weight: h.spec.Weight,
		Healthy: h.polled && !h.ejected, Reachable: h.reachable, Ejected: h.ejected,
		PollFailures: h.pollFails, ForwardFailures: h.fwdFails,
		PollLatencyMs: float64(h.pollLatency.Microseconds()) / 1000,
		Version:       h.status.Version, Pools: h.status.Pools,
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
		st.Pools = []pool.Status{}
	}
	return st
}

// Status returns the fleet view, hosts sorted by name.
func (f *Fleet) Status() ([]HostStatus, FileStatus) {
	hosts := f.snapshot()
	out := make([]HostStatus, 0, len(hosts))
	for _, name := range slices.Sorted(maps.Keys(hosts)) {
		out = append(out, hosts[name].statusView())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return out, f.fstat
}

func (h *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	hosts, file := h.fleet.Status()
	writeJSON(w, Status{Version: h.opts.Version, HostsFile: file, Hosts: hosts})
}

// ModelHost is one host that can serve a model, in GET /v1/models.
type ModelHost struct {
	Name string `json:"name"`
	// State is what the host says: "ready", "loading" or "available".
	State string   `json:"state"`
	Pools []string `json:"pools"`
}

// modelEntry is one entry of GET /v1/models: the OpenAI model object plus
// where it can run.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root"`
	// State is the best state among the hosts: ready, loading, sleeping or
	// available.
	State string      `json:"state"`
	Hosts []ModelHost `json:"hosts"`
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

// serveModels lists every name any healthy host serves, with the hosts.
func (h *Handler) serveModels(w http.ResponseWriter, r *http.Request) {
	hosts := h.fleet.snapshot()
	entries := make(map[string]*modelEntry)
	created := h.fleet.opts.Now().Unix()
	for _, name := range slices.Sorted(maps.Keys(hosts)) {
		hs := hosts[name]
		if !hs.healthy() {
			continue
		}
		for _, m := range hs.modelList() {
			e := entries[m.ID]
			if e == nil {
				e = &modelEntry{ID: m.ID, Object: "model", Created: created, OwnedBy: "fleetd", Root: m.Root, State: m.State}
				entries[m.ID] = e
			}
			if stateRank(m.State) < stateRank(e.State) {
				e.State = m.State
			}
			e.Hosts = append(e.Hosts, ModelHost{Name: name, State: m.State, Pools: m.Pools})
		}
	}
	data := make([]*modelEntry, 0, len(entries))
	for _, id := range slices.Sorted(maps.Keys(entries)) {
		data = append(data, entries[id])
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

// modelList returns the host's models sorted by name.
func (h *host) modelList() []hostModel {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Collect(maps.Values(h.models))
	slices.SortFunc(out, func(a, b hostModel) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// modelNames lists every name the healthy hosts serve, sorted.
func modelNames(hosts map[string]*host) []string {
	set := make(map[string]bool)
	for _, h := range hosts {
		if !h.healthy() {
			continue
		}
		for _, m := range h.modelList() {
			set[m.ID] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}
