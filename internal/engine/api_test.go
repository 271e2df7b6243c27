package engine

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeAPI is an API served by an httptest server that records every call
// ("POST /path body") and answers it with answer.
func fakeAPI(t *testing.T, answer func(call string) (status int, body string)) (API, func() []string) {
	t.Helper()
	var mu sync.Mutex // guards calls
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		call := r.Method + " " + r.URL.RequestURI()
		if len(b) > 0 {
			call += " " + string(b)
		}
		mu.Lock()
		calls = append(calls, call)
		mu.Unlock()
		status, body := answer(call)
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	port, err := strconv.Atoi(srv.URL[strings.LastIndexByte(srv.URL, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	return NewClients(nil, nil).At(port), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
}

// A pooling model serves no completions (vLLM answers 404): the warm-up
// runs it through /v1/embeddings instead, and fails when that fails.
func TestWarmUpPoolingModel(t *testing.T) {
	for _, tt := range []struct {
		name      string
		embedding int // the status of /v1/embeddings
		ok        bool
	}{
		{"embeds", http.StatusOK, true},
		{"serves no embeddings either", http.StatusNotFound, true},
		{"fails", http.StatusInternalServerError, false},
	} {
		api, calls := fakeAPI(t, func(call string) (int, string) {
			if strings.HasPrefix(call, "POST /v1/completions ") {
				return http.StatusNotFound, `{"detail":"Not Found"}`
			}
			return tt.embedding, "{}"
		})
		err := api.WarmUp(context.Background(), "e")
		if (err == nil) != tt.ok {
			t.Errorf("%s: warm-up %v, want ok %t", tt.name, err, tt.ok)
		}
		want := []string{`POST /v1/completions {"model":"e","prompt":"warm-up","max_tokens":1}`, `POST /v1/embeddings {"model":"e","input":"warm-up"}`}
		if got := calls(); !slices.Equal(got, want) {
			t.Errorf("%s: calls %q, want %q", tt.name, got, want)
		}
	}
}

// Serves says what /v1/models listed when it lacks the id, and a status
// or an undecodable answer as such; the zero API fails without a call.
func TestServes(t *testing.T) {
	for _, tt := range []struct {
		status     int
		body, seen string
		ok         bool
	}{
		{http.StatusOK, `{"data":[{"id":"m"}]}`, "", true},
		{http.StatusOK, `{"data":[{"id":"a"},{"id":"b"}]}`, `it lists ["a", "b"], not "m" (check --served-model-name)`, false},
		{http.StatusServiceUnavailable, `{}`, "answered 503 Service Unavailable", false},
		{http.StatusOK, `not json`, "undecodable answer: invalid character", false},
	} {
		api, _ := fakeAPI(t, func(string) (int, string) { return tt.status, tt.body })
		ok, seen := api.Serves(context.Background(), "m")
		if ok != tt.ok || !strings.HasPrefix(seen, tt.seen) {
			t.Errorf("%d %s: Serves = %t, %q; want %t, %q", tt.status, tt.body, ok, seen, tt.ok, tt.seen)
		}
	}
	if ok, seen := (API{}).Serves(context.Background(), "m"); ok || seen != errNoClient.Error() {
		t.Errorf("the zero API: Serves = %t, %q", ok, seen)
	}
}
