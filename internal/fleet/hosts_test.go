package fleet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFile(t *testing.T) {
	f, err := ParseFile([]byte(`{
		"hosts": [
			{"name": "gpu-1", "url": "http://10.0.0.1:8080", "labels": {"gpu": "h100"}, "weight": 3},
			{"name": "gpu-2", "url": "http://gpu-2.example:8443/"}
		],
		"dns": [
			{"name": "_poold._tcp.poold.llm.svc.cluster.local", "type": "srv", "interval": "10s"},
			{"name": "poold.service.consul", "type": "a", "port": 8080, "scheme": "http"}
		],
		"models": [
			{"name": "qwen-7b", "minCopies": 2, "maxCopies": 4, "scaleInWindow": "10m"},
			{"name": "llama-8b"}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Hosts) != 2 || f.Hosts[0].Weight != 3 || f.Hosts[1].Weight != 1 || f.Hosts[0].Labels["gpu"] != "h100" {
		t.Fatalf("hosts: %+v", f.Hosts)
	}
	if len(f.DNS) != 2 || f.DNS[0].Every() != 10*time.Second || f.DNS[1].Every() != DefaultDNSInterval ||
		f.DNS[0].Scheme != "http" || f.DNS[1].Scheme != "http" || f.DNS[0].Weight != 1 {
		t.Fatalf("dns: %+v", f.DNS)
	}
	want := []ModelSpec{{Name: "qwen-7b", MinCopies: 2, MaxCopies: 4, ScaleInWindow: "10m", window: 10 * time.Minute}, {Name: "llama-8b"}}
	if !slices.Equal(f.Models, want) {
		t.Fatalf("models: %+v", f.Models)
	}
}

// The example hosts file in profiles/ is valid, and bounds its model.
func TestExampleHostsFile(t *testing.T) {
	f, _, err := LoadFile(filepath.Join("..", "..", "profiles", "hosts-example.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Hosts) != 3 || len(f.DNS) != 1 || len(f.Models) != 1 || f.Models[0].MaxCopies != 3 || f.Models[0].window != 10*time.Minute {
		t.Fatalf("example: %+v", f)
	}
}

// Every problem is reported at once, each with its JSON path.
func TestParseFileErrors(t *testing.T) {
	cases := []struct {
		name string
		json string
		want []string
	}{
		{"not JSON", `{"hosts": [`, []string{"hosts file: unexpected EOF"}},
		{"unknown top-level field", `{"hosts": [], "host": []}`, []string{`hosts file: json: unknown field "host"`}},
		{"trailing data", `{"hosts": [{"name": "a", "url": "http://a"}]} {}`, []string{"hosts file: unexpected data after the JSON value"}},
		{"empty", `{}`, []string{"hosts file: no hosts and no dns names"}},
		{"unknown host field", `{"hosts": [{"name": "a", "url": "http://a", "lables": {}}]}`, []string{`hosts[0]: json: unknown field "lables"`}},
		{"wrong type", `{"hosts": [{"name": "a", "url": "http://a", "weight": "2"}]}`, []string{"hosts[0]: weight: must be a JSON number, not string"}},
		{"several problems in one file", `{"hosts": [
				{"name": "a", "url": "ftp://a"},
				{"name": "tls", "url": "https://tls:8443"},
				{"url": "http://b"},
				{"name": "a", "url": "http://a:1/v1", "weight": -1, "labels": {"": "x"}},
				{"name": "has space", "url": "http://"}
			], "dns": [
				{"name": "x", "type": "mx"},
				{"type": "a"},
				{"name": "y", "type": "srv", "port": 80, "interval": "soon", "scheme": "https"},
				{"name": "z", "type": "a", "port": 80, "interval": "10ms"}
			]}`, []string{
			`hosts[0] "a": url: scheme "ftp" is not http`,
			`hosts[1] "tls": url: scheme "https" is not supported: ` + noTLS,
			`hosts[2]: name: required`,
			`hosts[3] "a": url: "http://a:1/v1" must be a base URL: scheme and host[:port] only`,
			`hosts[3] "a": weight: must not be negative (zero means 1), not -1`,
			`hosts[3] "a": labels: a label name must not be empty`,
			`hosts[3] "a": name: already used by hosts[0] "a"`,
			`hosts[4] "has space": name: "has space": only printable ASCII without spaces`,
			`hosts[4] "has space": url: "http://" has no host`,
			`dns[0] "x": type: "mx" is neither "srv" nor "a"`,
			`dns[1]: name: required`,
			`dns[1]: port: required for type "a", between 1 and 65535 (not 0)`,
			`dns[2] "y": port: must be absent for type "srv" (SRV records carry the port)`,
			`dns[2] "y": scheme: "https" is not supported: ` + noTLS,
			`dns[2] "y": interval: invalid duration "soon"`,
			`dns[3] "z": interval: "10ms" is shorter than 1s`,
		}},
		{"bad model bounds", `{"hosts": [{"name": "a", "url": "http://a"}], "models": [
				{"name": "m", "minCopies": -1, "maxCopies": -2, "scaleInWindow": "500ms"},
				{"minCopies": 3, "maxCopies": 2},
				{"name": "m", "scaleInWindow": "later"},
				{"name": "n", "copies": 2}
			]}`, []string{
			`models[0] "m": minCopies: must not be negative (zero means 1), not -1`,
			`models[0] "m": maxCopies: must not be negative (zero means no bound), not -2`,
			`models[0] "m": scaleInWindow: "500ms" is shorter than 1s`,
			`models[1]: name: required`,
			`models[1]: maxCopies: 2 is below minCopies (3)`,
			`models[2] "m": scaleInWindow: invalid duration "later"`,
			`models[2] "m": name: already used by models[0] "m"`,
			`models[3]: json: unknown field "copies"`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile([]byte(c.json))
			if err == nil {
				t.Fatal("no error")
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(c.want), err)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], c.want[i]) {
					t.Errorf("error %d:\n got %s\nwant %s", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.json")
	if _, _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "reading hosts") {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte(`{"hosts": [{"name": "a", "url": "http://a"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	f, raw, err := LoadFile(path)
	if err != nil || len(f.Hosts) != 1 || len(raw) == 0 {
		t.Fatalf("LoadFile = %+v, %d bytes, %v", f, len(raw), err)
	}
}
