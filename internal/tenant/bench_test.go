package tenant_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/tenant"
)

// manyTenants is a tenants file of n tenants, each with rpm, tpm and an
// output cap, so that a request goes through every step of the gate; tenant
// i's key is "key-i".
func manyTenants(tb testing.TB, n int) *tenant.Config {
	tb.Helper()
	type t struct {
		Name            string   `json:"name"`
		Keys            []string `json:"keys"`
		Tier            string   `json:"tier"`
		RPM             int      `json:"rpm"`
		TPM             int      `json:"tpm"`
		MaxOutputTokens int      `json:"maxOutputTokens"`
	}
	ts := make([]t, n)
	for i := range ts {
		ts[i] = t{fmt.Sprintf("tenant-%d", i), []string{tenant.HashKey(fmt.Sprintf("key-%d", i))}, "shared", 1 << 30, 1 << 40, 1 << 20}
	}
	data, err := json.Marshal(map[string]any{"tiers": map[string]any{"shared": map[string]int{"weight": 1}}, "tenants": ts})
	if err != nil {
		tb.Fatal(err)
	}
	c, err := tenant.Parse(data)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// discardWriter is a ResponseWriter whose header map is reused.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkGate is what tenancy adds to one plain request: the key's
// tenant (Require), its limits with their six headers (Admit), its output
// cap inserted into the body (Cap), its worst case reserved (Reserve) and
// settled with the tokens used (Settle), with no
// tenants file (a nil gate: today's path) and with 10 and 10,000 tenants.
// make bench's workload 1t reads it.
func BenchmarkGate(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello there, how are you today?"}]}`)
	_, parsed, _ := openai.ReadRequest(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(string(body))), 1<<20)
	for _, n := range []int{0, 10, 10000} {
		name := fmt.Sprintf("tenants=%d", n)
		var g *tenant.Gate
		if n == 0 {
			name = "tenants=none"
		} else {
			g = tenant.NewGate(manyTenants(b, n), nil)
		}
		b.Run(name, func(b *testing.B) {
			var sent int
			h := g.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				t := tenant.FromContext(r.Context())
				if !g.Admit(w, r, t) {
					b.Fatal("refused")
				}
				bound, ok := g.Cap(w, r, t, "/v1/chat/completions", parsed)
				if !ok {
					b.Fatal("capped")
				}
				out := openai.Rewrite(body, parsed, openai.Changes{Bound: bound})
				worst := tenant.WorstCase("/v1/chat/completions", out, parsed, bound, 0)
				if !g.Reserve(w, r, t, worst) {
					b.Fatal("refused its worst case")
				}
				sent += len(out)
				g.Settle(t, worst, 20)
			}))
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.Header.Set("Authorization", fmt.Sprintf("Bearer key-%d", n/2))
			w := &discardWriter{h: make(http.Header)}
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
			if sent == 0 {
				b.Fatal("nothing sent")
			}
		})
	}
}
