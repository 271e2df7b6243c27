package enginesim

import (
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Every request gets an access log line as vLLM prints uvicorn's, with its
// query and status; --disable-access-log-for-endpoints leaves out the paths
// it lists (with or without a query), --disable-uvicorn-access-log all.
func TestAccessLog(t *testing.T) {
	prefix := "(APIServer pid=" + strconv.Itoa(os.Getpid()) + ") INFO:     127.0.0.1:"
	for _, tt := range []struct {
		flags []string
		want  []string
	}{
		{nil, []string{
			`"GET /metrics HTTP/1.1" 200 OK`,
			`"GET /health?probe=1 HTTP/1.1" 200 OK`,
			`"POST /v1/chat/completions HTTP/1.1" 200 OK`,
			`"POST /v1/chat/completions HTTP/1.1" 400 Bad Request`,
			`"POST /sleep HTTP/1.1" 404 Not Found`,
		}},
		{[]string{"--disable-access-log-for-endpoints", " /health, /metrics,"}, []string{
			`"POST /v1/chat/completions HTTP/1.1" 200 OK`,
			`"POST /v1/chat/completions HTTP/1.1" 400 Bad Request`,
			`"POST /sleep HTTP/1.1" 404 Not Found`,
		}},
		{[]string{"--disable-uvicorn-access-log"}, nil},
	} {
		cfg, err := ParseFlags(append([]string{"/models/x", "--served-model-name", "m1"}, tt.flags...))
		if err != nil {
			t.Fatal(err)
		}
		s := NewHandler(cfg, nil)
		var out syncBuffer
		s.access = &out
		ts := httptest.NewServer(s)
		t.Cleanup(ts.Close)
		do(t, http.MethodGet, ts.URL+"/metrics", "")
		do(t, http.MethodGet, ts.URL+"/health?probe=1", "")
		do(t, http.MethodPost, ts.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
		doHeader(t, http.MethodPost, ts.URL+"/v1/chat/completions", `{}`, map[string]string{"Content-Type": "text/plain"})
		do(t, http.MethodPost, ts.URL+"/sleep", "")
		var got []string
		for line := range strings.Lines(out.String()) {
			rest, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), prefix)
			port, req, _ := strings.Cut(rest, " - ")
			if _, err := strconv.Atoi(port); !ok || err != nil {
				t.Fatalf("%q: access line %q, want it to start %q and a port", tt.flags, line, prefix)
			}
			got = append(got, req)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q: access lines\n%q\nwant\n%q", tt.flags, got, tt.want)
		}
	}
}
