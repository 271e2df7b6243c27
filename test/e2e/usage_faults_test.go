package e2e

// The usage ledger under a failing disk (docs/usage.md, "What can be lost"):
// its file deleted under a running poold, the disk full.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// missing lists the request ids the clients saw finish that rows lacks.
func missing(s *sent, rows []ledgerRow) []string {
	ids, _ := lost(s, rows, time.Now())
	return ids
}

// health is GET /health or /ready: the code, the status and the reasons.
func (d *daemon) health(path string) (int, string, []string) {
	d.t.Helper()
	resp, err := http.Get(d.url + path)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status  string
		Reasons []string
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		d.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, body.Status, body.Reasons
}

// waitHealth polls /health until its status is want, for at most 30 s.
func (d *daemon) waitHealth(want string) []string {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, st, reasons := d.health("/health")
		if st == want {
			return reasons
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("/health says %q %v after 30 s, want %q", st, reasons, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUsageLedgerDeletedUnderPoold(t *testing.T) {
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	db := filepath.Join(state, "usage.db")
	profs := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil)
	d := startPoold(t, tag, profs, "--state-dir", state, "--access-log", os.DevNull, "--log-level", "warn")
	runUsageLoad(context.Background(), d.url, 4, 300, []string{"plain", "stream"}, newSent())
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}
	after := newSent()
	runUsageLoad(context.Background(), d.url, 4, 500, []string{"plain", "stream"}, after)
	d.stop()
	if d.err != nil {
		t.Fatalf("poold exited with %v", d.err)
	}
	if !strings.Contains(d.stderr.String(), "the usage database file was deleted") {
		t.Errorf("no ERROR about the deleted file in the log:\n%s", tail(d.stderr.String(), 20))
	}
	// A restart keeps them: they are in the file at the path.
	startPoold(t, tag, profs, "--state-dir", state, "--access-log", os.DevNull, "--log-level", "warn").stop()
	rows, _ := readLedger(t, db)
	if ids := missing(after, rows); len(ids) > 0 || after.count() != 500 {
		t.Errorf("of the %d requests answered after the deletion, the ledger at the path lacks %d: %v", after.count(), len(ids), ids[:min(len(ids), 5)])
	}
	t.Logf("after the deletion: %d requests answered, %d rows in the new file at the path", after.count(), len(rows))
}
