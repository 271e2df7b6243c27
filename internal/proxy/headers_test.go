package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/poold/poold/internal/pool"
)

func TestForwardedHeaders(t *testing.T) {
	h := http.Header{
		"Content-Type": {"application/json"}, "X-Trace": {"1"}, "Authorization": {"Bearer k"},
		"Cookie": {"a=b"}, "Connection": {"keep-alive, X-Hop"}, "X-Hop": {"1"}, "Te": {"trailers"},
	}
	var fwd []string
	for k := range h {
		if forwarded(h, k) {
			fwd = append(fwd, k)
		}
	}
	slices.Sort(fwd)
	if want := []string{"Content-Type", "X-Trace"}; !slices.Equal(fwd, want) {
		t.Errorf("forwarded %q, want %q", fwd, want)
	}
	if ok, why := forwardedHeaders(h); !ok {
		t.Errorf("ordinary headers refused: %s", why)
	}

	many := http.Header{}
	for range maxForwardedHeaders {
		many.Add("X-Many", "1")
	}
	many.Set("Authorization", "Bearer k") // not forwarded, so not counted
	if ok, why := forwardedHeaders(many); !ok {
		t.Errorf("%d fields refused: %s", maxForwardedHeaders, why)
	}
	many.Add("X-Many", "1")
	if ok, why := forwardedHeaders(many); ok || !strings.Contains(why, "65 header fields") {
		t.Errorf("%d fields: %v %q", maxForwardedHeaders+1, ok, why)
	}
	big := http.Header{"X-Big": {strings.Repeat("b", maxForwardedHeaderBytes-len("X-Big"))}, "Cookie": {strings.Repeat("c", 1<<20)}}
	if ok, why := forwardedHeaders(big); !ok {
		t.Errorf("%d bytes refused: %s", maxForwardedHeaderBytes, why)
	}
	big["X-Big"][0] += "b"
	if ok, _ := forwardedHeaders(big); ok {
		t.Errorf("%d bytes accepted", maxForwardedHeaderBytes+1)
	}
}

// A body poold read as a JSON object goes to the engine as
// application/json, whatever the client sent (curl -d sends a form's type,
// many scripts none): vLLM refuses any other with a 400. A form (an audio
// upload) keeps its own type, boundary included.
func TestEngineGetsJSONContentType(t *testing.T) {
	h := adminHandler(t, "")
	for _, tt := range []struct {
		sent, want string
		form       bool
	}{
		{"", "application/json", false},
		{"application/x-www-form-urlencoded", "application/json", false},
		{"text/plain", "application/json", false},
		{"application/json; charset=utf-8", "application/json", false},
		{"multipart/form-data; boundary=b", "multipart/form-data; boundary=b", true},
	} {
		in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		if tt.sent != "" {
			in.Header.Set("Content-Type", tt.sent)
		}
		x := &exchange{lease: &pool.Lease{Target: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}}, path: "/v1/chat/completions", body: []byte(`{"model":"m"}`), form: tt.form}
		in = in.WithContext(context.WithValue(in.Context(), exchangeKey{}, x))
		out := in.Clone(in.Context())
		h.rewriteOut(&httputil.ProxyRequest{In: in, Out: out})
		if got := out.Header.Values("Content-Type"); len(got) != 1 || got[0] != tt.want {
			t.Errorf("sent Content-Type %q (form %t): the engine gets %q, want %q", tt.sent, tt.form, got, tt.want)
		}
	}
}
