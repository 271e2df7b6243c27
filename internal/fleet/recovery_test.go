package fleet

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A hosts file refused and then restored to the one in force is reported,
// so that the refusal is not the log's last word.
func TestHostsFileRecoveryLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.json")
	good := []byte(`{"hosts": [{"name": "a", "url": "http://127.0.0.1:1"}]}`)
	write := func(b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	f := New(Options{Logger: slog.New(slog.NewTextHandler(&out, nil))})
	write(good)
	if err := f.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	write([]byte(`{"hosts": [{"name": "a"}]}`))
	if err := f.LoadFile(path); err == nil {
		t.Fatal("a host without a url was accepted")
	}
	if strings.Contains(out.String(), "valid again") {
		t.Fatalf("recovery logged before any:\n%s", out.String())
	}
	write(good)
	if err := f.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `msg="hosts file valid again; the hosts in force are unchanged"`) {
		t.Fatalf("no recovery in the log:\n%s", out.String())
	}
	if _, fs := f.Status(); fs.LastError != nil {
		t.Fatalf("last error kept after the recovery: %s", *fs.LastError)
	}
}
