package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
)

// maxAdminBody bounds an admin request's body.
const maxAdminBody = 64 << 10

// handleAdmin binds the admin API to mux, behind token:
//
//	POST /admin/pools/{pool}/load   {"profile": "<id or alias>"}
//	POST /admin/pools/{pool}/unload
//	POST /admin/pools/{pool}/clear-backoff
//
// Load and unload go through the pool's scheduler like requests (they wait
// their turn and drain the pool like a swap) and answer when done, with the
// pool's status. Clear-backoff ends the restart backoff of the pool's
// failing profile at once (Pool.ClearBackoff), and answers the pool's
// status.
func (h *Handler) handleAdmin(mux *http.ServeMux, token string) {
	want := sha256.Sum256([]byte(token))
	auth := func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !bearsToken(r, want) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="poold admin"`)
				openai.WriteError(w, r, http.StatusUnauthorized, "invalid_admin_token", "", "the admin API needs a valid admin token: Authorization: Bearer <token>")
				return
			}
			next(w, r)
		}
	}
	mux.HandleFunc("POST /admin/pools/{pool}/load", auth(h.serveLoad))
	mux.HandleFunc("POST /admin/pools/{pool}/unload", auth(h.serveUnload))
	mux.HandleFunc("POST /admin/pools/{pool}/clear-backoff", auth(h.serveClearBackoff))
}

// bearsToken reports whether r carries "Authorization: Bearer TOKEN" for
// the token whose SHA-256 is want. Comparing digests makes the comparison
// constant-time in the length of the token as well as in its content.
func bearsToken(r *http.Request, want [sha256.Size]byte) bool {
	scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1 && strings.EqualFold(scheme, "Bearer")
}

func (h *Handler) serveLoad(w http.ResponseWriter, r *http.Request) {
	p := h.adminPool(w, r)
	if p == nil {
		return
	}
	var body struct {
		Profile string `json:"profile"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		openai.WriteError(w, r, http.StatusBadRequest, "invalid_body", "", "invalid request body: "+err.Error())
		return
	}
	if body.Profile == "" {
		openai.WriteError(w, r, http.StatusBadRequest, "invalid_body", "profile", `"profile" is required`)
		return
	}
	prof := h.cfg.Load().Lookup(body.Profile)
	if prof == nil {
		openai.WriteError(w, r, http.StatusNotFound, "model_not_found", "profile", h.unknownModel(body.Profile, nil))
		return
	}
	if !prof.EligibleOn(p.Name()) {
		openai.WriteError(w, r, http.StatusBadRequest, "pool_not_eligible", "profile", fmt.Sprintf("profile %q may not run on pool %q", prof.ID, p.Name()))
		return
	}
	h.log.Info("admin load", "pool", p.Name(), "profile", prof.ID)
	h.adminDone(w, r, p, "load "+prof.ID, p.Load(r.Context(), prof))
}

func (h *Handler) serveUnload(w http.ResponseWriter, r *http.Request) {
	p := h.adminPool(w, r)
	if p == nil {
		return
	}
	h.log.Info("admin unload", "pool", p.Name())
	h.adminDone(w, r, p, "unload", p.Unload(r.Context()))
}

func (h *Handler) serveClearBackoff(w http.ResponseWriter, r *http.Request) {
	p := h.adminPool(w, r)
	if p == nil {
		return
	}
	h.log.Info("admin clear-backoff", "pool", p.Name(), "profile", p.ClearBackoff())
	writeJSON(w, p.Status())
}

// adminPool returns the pool named in the path, or answers 404.
func (h *Handler) adminPool(w http.ResponseWriter, r *http.Request) *pool.Pool {
	p := h.pools.Pool(r.PathValue("pool"))
	if p == nil {
		openai.WriteError(w, r, http.StatusNotFound, "pool_not_found", "", fmt.Sprintf("no pool %q", r.PathValue("pool")))
	}
	return p
}

// adminDone answers an admin action that ended with err: the pool's status
// when it succeeded, else an OpenAI-shaped error.
func (h *Handler) adminDone(w http.ResponseWriter, r *http.Request, p *pool.Pool, what string, err error) {
	var qe *pool.QueueError
	switch {
	case err == nil:
		writeJSON(w, p.Status())
		return
	case r.Context().Err() != nil:
		return // the client left and withdrew its intent; nobody to answer
	case errors.As(err, &qe):
		code := "queue_full"
		switch {
		case errors.Is(err, pool.ErrQueueTimeout):
			code = "queue_timeout"
		case errors.Is(err, pool.ErrBackoff):
			code = "engine_backoff"
		}
		openai.WriteUnavailable(w, r, code, fmt.Sprintf("pool %q: %s: %v", p.Name(), what, err), qe.RetryAfter)
	case errors.Is(err, pool.ErrShutdown):
		openai.WriteUnavailable(w, r, "shutting_down", err.Error(), 5*time.Second)
	default: // a failed load or stop
		openai.WriteError(w, r, http.StatusBadGateway, "engine_failed", "", fmt.Sprintf("pool %q: %s: %v", p.Name(), what, err))
	}
	h.log.Warn("admin action failed", "pool", p.Name(), "action", what, "err", err)
}
