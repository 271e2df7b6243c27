package proxy

import (
	"net/http"
	"slices"
	"strings"
	"testing"
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
