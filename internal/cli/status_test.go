package cli

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestBaseURL(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{in: "127.0.0.1:8090", want: "http://127.0.0.1:8090"},
		{in: "localhost:8080/", want: "http://localhost:8080"},
		{in: "http://127.0.0.1:8090", want: "http://127.0.0.1:8090"},
		{in: "https://fleetd.example:443/", want: "https://fleetd.example:443"},
		{in: "http://fleetd/base", want: "http://fleetd/base"},
		{in: "[::1]:8080", want: "http://[::1]:8080"},
		{in: "ftp://host:21", err: `address "ftp://host:21": scheme "ftp" is neither http nor https`},
		{in: "", err: `address "": no host`},
		{in: "http://", err: `address "http://": no host`},
		{in: "127.0.0.1:port", err: `address "127.0.0.1:port": parse "http://127.0.0.1:port": invalid port ":port" after host`},
	} {
		got, err := baseURL(tt.in)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && err.Error() != tt.err {
			t.Errorf("baseURL(%q) = %q, %v; want %q, %q", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// testStatus is the part of a /status that printTest prints.
type testStatus struct {
	Version string
	Pools   []struct{}
}

func printTest(w io.Writer, st testStatus) {
	fmt.Fprintf(w, "version %s, %d pools\n", st.Version, len(st.Pools))
}

// TestStatusCommandAddresses: --addr takes host:port or a URL, and --json
// prints the body as sent.
func TestStatusCommandAddresses(t *testing.T) {
	const body = `{"version":"v1","config":{},"pools":[]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, body)
	}))
	defer srv.Close()
	cmd := StatusCommand[testStatus]{Daemon: "poold", AddrEnv: "TEST_STATUS_ADDR", DefaultAddr: "127.0.0.1:1", Print: printTest}
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	t.Setenv("TEST_STATUS_ADDR", hostPort)
	for _, tt := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{args: nil, stdout: "version v1, 0 pools\n"}, // from TEST_STATUS_ADDR
		{args: []string{"--addr", hostPort}, stdout: "version v1, 0 pools\n"},
		{args: []string{"--addr", srv.URL + "/"}, stdout: "version v1, 0 pools\n"},
		{args: []string{"--addr", hostPort, "--json"}, stdout: body},
		{args: []string{"--addr", srv.URL + "/nowhere"}, code: 1, errs: "poold status: GET " + srv.URL + "/nowhere/status: 404 Not Found\n"},
		{args: []string{"--addr", "ftp://" + hostPort}, code: 2, errs: "poold status: --addr: address \"ftp://" + hostPort + "\": scheme \"ftp\" is neither http nor https\n"},
		{args: []string{"extra"}, code: 2, errs: "poold status: unexpected arguments [\"extra\"]\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := cmd.Run(tt.args, &stdout, &stderr)
		if code != tt.code || stdout.String() != tt.stdout || !strings.HasPrefix(stderr.String(), tt.errs) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.errs)
		}
	}
}

// TestStatusCommandOtherDaemon: a status command pointed at the other
// daemon, or at something else, says so and exits 1, with or without --json.
func TestStatusCommandOtherDaemon(t *testing.T) {
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	fleetd := serve(`{"version":"v2","hostsFile":{"path":"/etc/poold/hosts.json"},"hosts":[]}`)
	poold := serve(`{"version":"v1","host":"gpu-1","config":{"path":"p.json"},"gpu":{},"pools":[]}`)
	other := serve(`{"status":"ok"}`)
	badPoold := serve(`{"version":1,"config":{},"pools":[]}`)
	notJSON := serve(`<html>`)
	pooldCmd := StatusCommand[testStatus]{Daemon: "poold", Print: printTest}
	fleetdCmd := StatusCommand[testStatus]{Daemon: "fleetd", Print: printTest}
	for _, tt := range []struct {
		cmd    StatusCommand[testStatus]
		addr   string
		code   int
		stderr string
	}{
		{pooldCmd, poold, 0, ""},
		{fleetdCmd, fleetd, 0, ""},
		{pooldCmd, fleetd, 1, "poold status: " + fleetd + " is a fleetd (version v2), not a poold; run: fleetd status --addr " + fleetd + "\n"},
		{fleetdCmd, poold, 1, "fleetd status: " + poold + " is a poold (version v1), not a fleetd; run: poold status --addr " + poold + "\n"},
		{pooldCmd, other, 1, "poold status: " + other + `/status is not poold's status (no "config" and "pools")` + "\n"},
		{fleetdCmd, notJSON, 1, "fleetd status: decoding " + notJSON + "/status: invalid character '<' looking for beginning of value\n"},
	} {
		for _, args := range [][]string{{"--addr", tt.addr}, {"--addr", tt.addr, "--json"}} {
			var stdout, stderr bytes.Buffer
			code := tt.cmd.Run(args, &stdout, &stderr)
			if code != tt.code || stderr.String() != tt.stderr || (code == 0) != (stdout.Len() > 0) {
				t.Errorf("%s status %q: exit %d, stdout %q, stderr %q; want %d, %q", tt.cmd.Daemon, args, code, stdout.String(), stderr.String(), tt.code, tt.stderr)
			}
		}
	}
	// --json prints what the daemon sent; the table needs it to decode.
	var stdout, stderr bytes.Buffer
	want := "poold status: decoding " + badPoold + "/status: json: cannot unmarshal number into Go struct field testStatus.Version of type string\n"
	if code := pooldCmd.Run([]string{"--addr", badPoold}, &stdout, &stderr); code != 1 || stderr.String() != want {
		t.Errorf("undecodable status: exit %d, stderr %q; want 1, %q", code, stderr.String(), want)
	}
}
