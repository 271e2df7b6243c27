package main

import (
	"bytes"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func statusServer(t *testing.T) *httptest.Server {
	t.Helper()
	body, err := os.ReadFile("testdata/status.json")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestStatusTable compares `poold status` with testdata/status.golden.
func TestStatusTable(t *testing.T) {
	srv := statusServer(t)
	var stdout, stderr bytes.Buffer
	// The address without a scheme, as an operator types it.
	if code := status([]string{"--addr", strings.TrimPrefix(srv.URL, "http://")}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	const golden = "testdata/status.golden"
	if *update {
		if err := os.WriteFile(golden, stdout.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if stdout.String() != string(want) {
		t.Errorf("status table differs\ngot:\n%s\nwant:\n%s", stdout.String(), want)
	}
}

func TestStatusJSONIsVerbatim(t *testing.T) {
	srv := statusServer(t)
	var stdout, stderr bytes.Buffer
	if code := status([]string{"--addr", srv.URL + "/", "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want, _ := os.ReadFile("testdata/status.json")
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Errorf("--json output differs from the body served:\n%s", stdout.String())
	}
}

func TestStatusErrors(t *testing.T) {
	srv := statusServer(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--addr", dead.URL}, 1, "poold status: "},
		{[]string{"--addr", srv.URL + "/nowhere"}, 1, "404 Not Found"},
		{[]string{"extra"}, 2, "usage: poold status"},
		{[]string{"--bogus"}, 2, "unknown flag"},
	} {
		var stdout, stderr bytes.Buffer
		code := status(tt.args, &stdout, &stderr)
		if code != tt.code || !strings.Contains(stderr.String(), tt.msg) || stdout.Len() != 0 {
			t.Errorf("status(%q) = %d, stdout %q, stderr %q; want %d and %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.msg)
		}
	}
}
