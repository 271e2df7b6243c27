package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// The pools are built but never run, so no engine starts: an unload of an
// empty pool is done at once, and everything else is refused before it
// reaches a pool.
const adminConfig = `{
  "pools": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1]}],
  "profiles": [
    {"id": "m", "model": "org/m", "command": ["true", "{port}"]},
    {"id": "only-b", "model": "org/b", "pools": ["b"], "command": ["true", "{port}"]}
  ]
}`

func adminHandler(t *testing.T, token string) *Handler {
	t.Helper()
	cfg, err := profile.Parse([]byte(adminConfig))
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, pool.NewSet(cfg, pool.Options{}), Options{AdminToken: token})
}

func adminDo(h http.Handler, path, auth, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestAdminUnboundWithoutToken(t *testing.T) {
	h := adminHandler(t, "")
	for _, path := range []string{"/admin/pools/a/unload", "/admin/pools/a/load", "/admin/pools/a/clear-backoff"} {
		if rec := adminDo(h, path, "Bearer x", `{"profile":"m"}`); rec.Code != http.StatusNotFound {
			t.Errorf("%s without an admin token: %d, want 404", path, rec.Code)
		}
	}
}

func TestAdminToken(t *testing.T) {
	h := adminHandler(t, "s3cret")
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"} {
		rec := adminDo(h, "/admin/pools/a/unload", auth, "")
		var e struct{ Error openaiError }
		if rec.Code != http.StatusUnauthorized || json.Unmarshal(rec.Body.Bytes(), &e) != nil ||
			e.Error.Type != "authentication_error" || rec.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d %s", auth, rec.Code, rec.Body)
		}
	}
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret"} {
		rec := adminDo(h, "/admin/pools/a/unload", auth, "")
		var st statusapi.Pool
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Name != "a" || st.State != pool.StateEmpty.String() {
			t.Errorf("Authorization %q: %d %s", auth, rec.Code, rec.Body)
		}
	}
}

func TestAdminBadRequests(t *testing.T) {
	h := adminHandler(t, "s3cret")
	cases := []struct {
		path, body string
		code       int
		errCode    string
	}{
		{"/admin/pools/nope/load", `{"profile":"m"}`, 404, "pool_not_found"},
		{"/admin/pools/nope/unload", ``, 404, "pool_not_found"},
		{"/admin/pools/nope/clear-backoff", ``, 404, "pool_not_found"},
		{"/admin/pools/a/load", `{"profile":"nope"}`, 404, "model_not_found"},
		{"/admin/pools/a/load", `{"profile":"only-b"}`, 400, "pool_not_eligible"},
		{"/admin/pools/a/load", `{}`, 400, "invalid_body"},
		{"/admin/pools/a/load", `{"profile":"m","x":1}`, 400, "invalid_body"},
		{"/admin/pools/a/load", `{"profile":`, 400, "invalid_body"},
	}
	for _, c := range cases {
		rec := adminDo(h, c.path, "Bearer s3cret", c.body)
		var e struct{ Error openaiError }
		if rec.Code != c.code || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != c.errCode {
			t.Errorf("%s %s: %d %s; want %d %s", c.path, c.body, rec.Code, rec.Body, c.code, c.errCode)
		}
	}
}

// clear-backoff needs the admin token, and answers the pool's status: here
// with nothing to clear (a pool that never ran has no failing profile).
func TestAdminClearBackoff(t *testing.T) {
	h := adminHandler(t, "s3cret")
	if rec := adminDo(h, "/admin/pools/a/clear-backoff", "Bearer wrong", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d %s", rec.Code, rec.Body)
	}
	rec := adminDo(h, "/admin/pools/a/clear-backoff", "Bearer s3cret", "")
	var st statusapi.Pool
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Name != "a" || st.Failing != nil {
		t.Fatalf("clear-backoff: %d %s", rec.Code, rec.Body)
	}
}

// An explicit load of a profile whose restarts back off is refused as a
// request for it is: 503 engine_backoff with Retry-After, not queue_full.
func TestAdminLoadDuringBackoff(t *testing.T) {
	h := adminHandler(t, "s3cret")
	refusal := &pool.QueueError{Err: fmt.Errorf("%w after 2 consecutive failures (next start in 1m0s); last error: boom", pool.ErrBackoff), RetryAfter: time.Minute}
	r := httptest.NewRequest(http.MethodPost, "/admin/pools/a/load", nil)
	rec := httptest.NewRecorder()
	h.adminDone(rec, r, h.pools.Pool("a"), "load m", refusal)
	var e struct{ Error openaiError }
	if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != "engine_backoff" ||
		rec.Header().Get("Retry-After") != "60" || !strings.Contains(e.Error.Message, "consecutive failures") {
		t.Fatalf("load refused by the backoff: %d %s %v", rec.Code, rec.Body, rec.Header())
	}
}

// openaiError is the "error" member of an OpenAI-shaped error body.
type openaiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

func TestUsageReportBehindTheAdminToken(t *testing.T) {
	cfg, err := profile.Parse([]byte(adminConfig))
	if err != nil {
		t.Fatal(err)
	}
	report := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("report " + r.URL.RawQuery)) })
	for _, c := range []struct {
		token, auth string
		code        int
	}{
		{"", "Bearer s3cret", http.StatusNotFound}, // no admin token: unbound
		{"s3cret", "", http.StatusUnauthorized},
		{"s3cret", "Bearer nope", http.StatusUnauthorized},
		{"s3cret", "Bearer s3cret", http.StatusOK},
	} {
		h := New(cfg, pool.NewSet(cfg, pool.Options{}), Options{AdminToken: c.token, UsageReport: report})
		r := httptest.NewRequest(http.MethodGet, "/usage?since=1h", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != c.code || (c.code == http.StatusOK && rec.Body.String() != "report since=1h") {
			t.Errorf("token %q, Authorization %q: %d %s, want %d", c.token, c.auth, rec.Code, rec.Body, c.code)
		}
	}
}
