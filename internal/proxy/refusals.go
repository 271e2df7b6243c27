package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/tenant"
)

// acquireError answers a request that got no lease and returns the status sent.
func (h *Handler) acquireError(w http.ResponseWriter, r *http.Request, prof *profile.Profile, err error) int {
	var qe *pool.QueueError
	var le *pool.LoadError
	switch {
	case r.Context().Err() != nil:
		return 499
	case errors.As(err, &qe):
		code := "queue_full"
		switch {
		case errors.Is(err, pool.ErrQueueTimeout):
			code = "queue_timeout"
		case errors.Is(err, pool.ErrQueueBudget):
			code = "queue_budget"
		case errors.Is(err, pool.ErrBackoff):
			code = "engine_backoff"
		}
		if code != "queue_timeout" {
			w.Header().Set(openai.RefusedHeader, code) // a full queue or body budget refuses at arrival only
		}
		openai.WriteUnavailable(w, r, code, fmt.Sprintf("model %q: %v", prof.ID, err), qe.RetryAfter)
		return http.StatusServiceUnavailable
	case errors.As(err, &le):
		openai.WriteError(w, r, http.StatusBadGateway, "engine_failed", "", err.Error())
		return http.StatusBadGateway
	case errors.Is(err, pool.ErrNoPool):
		msg := fmt.Sprintf("model %q is not served on pool %q", prof.ID, r.PathValue("pool"))
		if h.pools.Pool(r.PathValue("pool")) == nil { // removed by a reload meanwhile
			msg = h.unknownPool(r.PathValue("pool"))
		}
		openai.WriteError(w, r, http.StatusNotFound, "pool_not_found", "", msg)
		return http.StatusNotFound
	case errors.Is(err, pool.ErrNoSwap):
		openai.WriteError(w, r, http.StatusForbidden, "pool_not_allowed", "", h.noSwap(r, prof))
		return http.StatusForbidden
	case errors.Is(err, pool.ErrShutdown):
		w.Header().Set(openai.RefusedHeader, "shutting_down")
		openai.WriteUnavailable(w, r, "shutting_down", err.Error(), shutdownRetry)
		return http.StatusServiceUnavailable
	case errors.Is(err, pool.ErrProfileRemoved):
		openai.WriteError(w, r, http.StatusNotFound, "model_not_found", "model", fmt.Sprintf("model %q: %v", prof.ID, err))
		return http.StatusNotFound
	case errors.Is(err, pool.ErrPoolRemoved):
		w.Header().Set(openai.RefusedHeader, "pool_removed")
		openai.WriteUnavailable(w, r, "pool_removed", fmt.Sprintf("model %q: %v", prof.ID, err), time.Second)
		return http.StatusServiceUnavailable
	default:
		openai.WriteError(w, r, http.StatusInternalServerError, "internal_error", "", err.Error())
		return http.StatusInternalServerError
	}
}

// noSwap is the message of a 403 pool_not_allowed: the tenant's request
// pinned to a pool that its pools do not allow it to swap, whose model is
// neither there nor where poold would place it.
func (h *Handler) noSwap(r *http.Request, prof *profile.Profile) string {
	return fmt.Sprintf("model %q is not loaded or loading on pool %q, and tenant %q may not swap that pool (the pools of its tenants-file entry do not match it); send the request unpinned, to POST /v1/..., and poold places it where the model is",
		prof.ID, r.PathValue("pool"), tenant.FromContext(r.Context()).Name)
}

// maxListed bounds the names listed in a 404.
const maxListed = 50

// unknownModel is the message of a 404 model_not_found for name: it lists
// the models there are, those of ten when it is not nil (so that a tenant
// learns nothing of the others').
func (h *Handler) unknownModel(name string, ten *tenant.Tenant) string {
	names := h.visibleNames(ten)
	more := ""
	if len(names) > maxListed {
		more = fmt.Sprintf(" and %d more", len(names)-maxListed)
		names = names[:maxListed]
	}
	return fmt.Sprintf("model %s does not exist; available models: %s%s", strconv.Quote(name), strings.Join(names, ", "), more)
}

// unknownPool says that pool name does not exist, listing those that do.
func (h *Handler) unknownPool(name string) string {
	ps := h.pools.Pools()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name()
	}
	return fmt.Sprintf("pool %s does not exist; pools: %s", strconv.Quote(name), strings.Join(names, ", "))
}
