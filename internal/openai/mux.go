package openai

import (
	"fmt"
	"net/http"
	"strconv"
)

// ServeMux serves r with mux, but answers in poold's shape (WriteError)
// what mux has no route for, where mux itself would answer in plain text:
// a path it does not serve gets a 404 unknown_route, a method it does not
// serve the path with a 405 method_not_allowed with mux's Allow header.
func ServeMux(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	h, pattern := mux.Handler(r)
	if pattern != "" { // a route, or mux's redirect to one
		mux.ServeHTTP(w, r)
		return
	}
	// mux's own 404 or 405: only its status and Allow header are kept.
	rec := &headerRecorder{header: make(http.Header)}
	h.ServeHTTP(rec, r)
	if rec.status == http.StatusMethodNotAllowed {
		WriteMethodNotAllowed(w, r, rec.header.Get("Allow"))
		return
	}
	WriteError(w, r, http.StatusNotFound, "unknown_route", "", fmt.Sprintf("%s %s: no such endpoint", r.Method, strconv.Quote(r.URL.EscapedPath())))
}

// WriteMethodNotAllowed answers a request whose path is served with other
// methods only, those of allow (an Allow header's value).
func WriteMethodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	WriteError(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "",
		fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, strconv.Quote(r.URL.EscapedPath()), allow))
}

// headerRecorder is a ResponseWriter that keeps the header and status
// written to it and discards the body.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerRecorder) WriteHeader(status int)      { h.status = status }
