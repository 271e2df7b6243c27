package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/fleet"
	"github.com/poold/poold/internal/headerbudget"
	"github.com/poold/poold/internal/statusapi"
)

func TestStatusTable(t *testing.T) {
	profile := "qwen"
	bad := "hosts[0]: url: required\nmore"
	unauthorized := "GET http://10.0.0.2:8080/v1/models: status 401 Unauthorized"
	now := time.Now()
	badTenants := "tenants[0] \"a\": tier \"gold\": no such tier (tiers: shared)\nmore"
	st := statusapi.Fleetd{Version: "v1", HostsFile: statusapi.File{Path: "/etc/poold/hosts.json", LastError: &bad}, Hosts: []statusapi.Host{
		{Name: "gpu-1", Healthy: true, Reachable: true, LastPoll: &now, PollLatencyMs: 1.25, Pools: []statusapi.Pool{
			{Name: "gpu0", State: statusapi.StateReady, Profile: &profile, InFlight: 2, Waiting: map[string]int{"llama": 1, "bge": 3}},
		}},
		// Ejected, with the pools of its last good poll: not shown.
		{Name: "gpu-2", Ejected: true, LastPoll: &now, PollLatencyMs: 0.5, LastError: &unauthorized, Pools: []statusapi.Pool{
			{Name: "gpu0", State: statusapi.StateReady, Profile: &profile, InFlight: 1},
		}},
		{Name: "gpu-3"},
	}}
	st.TenantsFile = &statusapi.File{Path: "/etc/poold/tenants.json", LastError: &badTenants}
	st.TenantLimits = &statusapi.TenantLimits{Store: "redis", Reachable: false, Disagreements: []statusapi.LimitsDisagreement{
		{Tenant: "team-a", Replica: "fleetd-2/41", Limits: "rpm=60 tpm=0", Ours: "rpm=600 tpm=0"},
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()

	var out bytes.Buffer
	// The address as host:port, as poold status takes it.
	if code := status([]string{"--addr", strings.TrimPrefix(srv.URL, "http://")}, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"fleetd v1, hosts file /etc/poold/hosts.json (last reload refused: hosts[0]: url: required)",
		`tenants file /etc/poold/tenants.json, limits in redis (fail-open), unreachable: requests let through unchecked (last reload refused: tenants[0] "a": tier "gold": no such tier (tiers: shared))`,
		"tenant team-a: limits rpm=600 tpm=0 here, rpm=60 tpm=0 at replica fleetd-2/41 (buckets of their own: the tenants files differ)",
		"HOST   HEALTH   POOL  STATE  PROFILE  SWITCHING  IN FLIGHT  WAITING        POLL   LAST ERROR",
		"gpu-1  up       gpu0  ready  qwen     -          2          bge:3,llama:1  1.2ms  -",
		"gpu-2  ejected  -     -      -        -          -          -              0.5ms  " + unauthorized,
		"gpu-3  unknown  -     -      -        -          -          -              -      -",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "\ngpu-2 "); n != 1 {
		t.Errorf("ejected host on %d rows, want 1:\n%s", n, out.String())
	}
	out.Reset()
	if code := status([]string{"--addr", srv.URL, "--json"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), `"name":"gpu-2"`) {
		t.Fatalf("--json: exit %d\n%s", code, out.String())
	}
	if code := status([]string{"--addr", srv.URL + "/nowhere"}, &out, io.Discard); code != 1 {
		t.Fatalf("a 404 exits %d", code)
	}
}

func TestSettings(t *testing.T) {
	t.Setenv("FLEETD_HOSTS", "/env/hosts.json")
	t.Setenv("FLEETD_SCALE_IN_WINDOW", "5s")
	s, err := loadSettings([]string{"--scale-in-window", "3s", "--scale-out=false", "--load-slack", "0", "--retry-silent=false", "--read-timeout", "5s"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Hosts != "/env/hosts.json" || s.Fleet.ScaleInWindow != 3*time.Second || s.Handler.ScaleOut || s.Handler.LoadSlack != 0 ||
		s.Fleet.PollInterval != fleet.DefaultPollInterval || s.Handler.AffinityHeader != fleet.DefaultAffinityHeader ||
		!s.Fleet.KeepSilent || s.ReadTimeout != 5*time.Second || s.Fleet.SilentAfter != fleet.DefaultSilentAfter ||
		s.Handler.AffinityEpsilon != fleet.DefaultAffinityEpsilon || s.MaxHeaderBytes != headerbudget.DefaultMaxHeaderBytes ||
		s.HeaderBytesBudget != headerbudget.DefaultMaxBytes {
		t.Fatalf("settings: %+v", s)
	}
	keyFile := filepath.Join(t.TempDir(), "host-key")
	if err := os.WriteFile(keyFile, []byte(" sk-host \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = loadSettings([]string{"--api-keys", "sk-a,sk-b", "--host-api-key-file", keyFile, "--host-admin-token-file", keyFile})
	if err != nil || s.APIKeys == nil || s.Fleet.PollKey != "sk-host" || s.Fleet.AdminToken != "sk-host" ||
		!s.Handler.ScaleOut || s.Fleet.ScaleInWindow != 5*time.Second { // FLEETD_SCALE_IN_WINDOW
		t.Fatalf("keys: %v, %+v", err, s)
	}
	s, err = loadSettings([]string{"--tenants", "/etc/poold/tenants.json", "--redis-url", "redis://127.0.0.1:6379", "--redis-fail-closed", "--redis-timeout", "1s"})
	if err != nil || s.Tenants != "/etc/poold/tenants.json" || !s.RedisFailClosed || s.RedisTimeout != time.Second || s.Handler.ClaimTimeout != time.Second {
		t.Fatalf("tenants: %v, %+v", err, s)
	}
	_, err = loadSettings([]string{"--tenants", "t.json", "--api-keys-file", keyFile, "--redis-fail-closed", "--redis-timeout", "0s"})
	for _, want := range []string{"tenants: not with api-keys or api-keys-file", "redis-fail-closed: needs redis-url", "redis-timeout: must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	t.Setenv("FLEETD_HOSTS", "")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = loadSettings([]string{"--poll-interval", "0s", "--log-format", "xml", "--scale-in-window", "500ms", "--host-admin-token-file", empty,
		"--api-keys", "sha256:zz", "--host-api-key-file", empty, "--silent-after", "0", "--read-timeout", "-1s", "--affinity-epsilon", "-0.5"})
	for _, want := range []string{"hosts: a hosts file is required", "poll-interval: must be positive", `log-format: "xml"`, "scale-in-window: 500ms is shorter than 1s", "host-admin-token-file: " + strconv.Quote(empty) + " holds no token",
		"silent-after: must be positive", "read-timeout: must not be negative", "affinity-epsilon: must not be negative",
		"api-keys: api key 0: sha256: must be followed by 64 hex digits", "host-api-key-file: " + strconv.Quote(empty) + " holds no key"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// fleetd check validates a hosts file, a tenants file, or both, with every
// problem of each.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	hosts := write("hosts.json", `{"hosts": [{"name": "a", "url": "http://10.0.0.1:8080"}]}`)
	tenants := write("tenants.json", `{"tiers": {"shared": {"weight": 1}}, "tenants": [{"name": "a", "keys": ["sha256:`+strings.Repeat("ab", 32)+`"], "tier": "shared"}]}`)
	badTenants := write("bad-tenants.json", `{"tiers": {"shared": {"weight": 0}}, "tenants": [{"name": "a", "keys": ["sk-clear"], "tier": "gold"}]}`)
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr []string
	}{
		{[]string{hosts}, 0, []string{hosts + ": ok"}, nil},
		{[]string{"--tenants", tenants}, 0, []string{tenants + ": ok"}, nil},
		{[]string{"--tenants", tenants, hosts}, 0, []string{tenants + ": ok", hosts + ": ok"}, nil},
		{[]string{"--tenants", badTenants, hosts}, 1, []string{hosts + ": ok"}, []string{badTenants + ": invalid:",
			"tiers.shared: weight: must be at least 1, not 0", `tenants[0] "a": tier "gold": no such tier`, `tenants[0] "a": keys[0]: must be sha256:`}},
		{[]string{"--tenants", filepath.Join(dir, "none.json")}, 2, nil, []string{"fleetd check: reading tenants"}},
		{nil, 2, nil, []string{"usage: fleetd check [--tenants TENANTS] [HOSTS]"}},
	} {
		var stdout, stderr bytes.Buffer
		code := check(tc.args, &stdout, &stderr)
		if code != tc.code {
			t.Errorf("check %v: exit %d, want %d\n%s%s", tc.args, code, tc.code, &stdout, &stderr)
		}
		for _, want := range tc.stdout {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("check %v: stdout lacks %q:\n%s", tc.args, want, &stdout)
			}
		}
		for _, want := range tc.stderr {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("check %v: stderr lacks %q:\n%s", tc.args, want, &stderr)
			}
		}
		if strings.Contains(stdout.String()+stderr.String(), "sk-clear") {
			t.Errorf("check %v: a key in clear was echoed", tc.args)
		}
	}
}
