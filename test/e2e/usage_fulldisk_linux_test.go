//go:build linux

package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestUsageLedgerOnAFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("a small tmpfs is needed for a full disk, and mounting one was refused: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	tag := t.Name()
	db := filepath.Join(dir, "usage.db")
	profs := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil)
	d := startPoold(t, tag, profs, "--usage-db", db, "--access-log", os.DevNull, "--log-level", "warn")
	s := newSent()
	runUsageLoad(context.Background(), d.url, 4, 50, []string{"plain"}, s)
	filler := filepath.Join(dir, "filler")
	fillDisk(t, filler)
	runUsageLoad(context.Background(), d.url, 4, 400, []string{"plain", "stream"}, s)
	reasons := d.waitHealth("degraded")
	if len(reasons) != 1 || !strings.Contains(reasons[0], "usage ledger rows are not being written") || !strings.Contains(reasons[0], "full") {
		t.Errorf("/health's reasons while the disk is full: %q", reasons)
	}
	if code, st, r := d.health("/ready"); code != http.StatusOK || st != "degraded" || len(r) != 1 {
		t.Errorf("/ready while the disk is full: %d %q %q, want 200, degraded and the reason", code, st, r)
	}
	if n := d.metricValue("poold_usage_write_errors_total"); n < 1 {
		t.Errorf("poold_usage_write_errors_total %v while the disk is full", n)
	}
	t.Logf("disk full: /health %q", reasons)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	d.waitHealth("ok")
	d.stop()
	rows, _ := readLedger(t, db)
	if ids := missing(s, rows); len(ids) > 0 || s.count() != 450 {
		t.Errorf("of %d requests answered, the ledger lacks %d once the disk had room again: %v", s.count(), len(ids), ids[:min(len(ids), 5)])
	}
}

// fillDisk writes the file at path until its file system is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for range 1 << 16 { // 256 MiB at most: the file system is far smaller
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
	t.Fatal("the file system did not fill")
}
