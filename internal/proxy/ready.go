package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// Saturation thresholds of GET /ready (Options.ReadyMaxEngineWaiting and
// ReadyMaxKVCacheUsage) unless set.
const (
	DefaultReadyMaxEngineWaiting = 10
	DefaultReadyMaxKVCacheUsage  = 0.95
)

// Reasons a pool is saturated (statusapi.Saturation).
const (
	saturatedEngineWaiting = "engine_waiting"
	saturatedKVCache       = "kv_cache_full"
	saturatedQueue         = "queue_full"
)

// serveReady is poold's readiness for load balancers: 200 while every pool
// with demand (a request in flight or waiting) can take more, 503 with the
// saturated pools and why (saturation), or 503 once a shutdown drains.
// /health stays liveness only. A daemon that serves with something wrong
// (Options.Degraded: a usage ledger that does not write) stays ready, 200
// with status "degraded" and the reasons: it serves every request as well,
// and taking it out of a balancer would turn a bookkeeping fault into lost
// capacity; the reasons are for the operator, and the alerts.
func (h *Handler) serveReady(w http.ResponseWriter, r *http.Request) {
	body := statusapi.Ready{Status: "ready"}
	if h.opts.Degraded != nil {
		body.Reasons = h.opts.Degraded()
	}
	switch {
	case h.draining.Load():
		body.Status = "draining"
	default:
		if body.Saturated = h.saturation(h.PoolStatus(), h.cfg.Load()); len(body.Saturated) > 0 {
			body.Status = "saturated"
		} else if len(body.Reasons) > 0 {
			body.Status = "degraded"
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if body.Status != "ready" && body.Status != "degraded" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// saturation lists why each pool with demand can take no more: its engine
// queues more than ReadyMaxEngineWaiting requests or uses more than
// ReadyMaxKVCacheUsage of its KV cache (from its engineStats), or poold's
// queue for it holds its maxQueue.
func (h *Handler) saturation(pools []statusapi.Pool, cfg *profile.Config) []statusapi.Saturation {
	var out []statusapi.Saturation
	for _, p := range pools {
		queued := 0
		for _, n := range p.Waiting {
			queued += n
		}
		if p.InFlight == 0 && queued == 0 {
			continue // no demand
		}
		add := func(reason, format string, args ...any) {
			out = append(out, statusapi.Saturation{Pool: p.Name, Reason: reason, Message: fmt.Sprintf(format, args...)})
		}
		if st := p.EngineStats; st != nil {
			if st.Waiting > h.opts.ReadyMaxEngineWaiting {
				add(saturatedEngineWaiting, "the engine queues %d requests (more than %d)", st.Waiting, h.opts.ReadyMaxEngineWaiting)
			}
			if st.KVCacheUsage > h.opts.ReadyMaxKVCacheUsage {
				add(saturatedKVCache, "the engine's KV cache is %.0f%% full (more than %.0f%%)", st.KVCacheUsage*100, h.opts.ReadyMaxKVCacheUsage*100)
			}
		}
		if spec := cfg.Pool(p.Name); spec != nil && spec.MaxQueue > 0 && queued >= spec.MaxQueue {
			add(saturatedQueue, "poold's queue holds %d requests, its maxQueue", queued)
		}
	}
	return out
}
