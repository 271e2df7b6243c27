//go:build linux

package usage

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLedgerSpoolsWhileTheDiskIsFull(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("a small tmpfs is needed for a full disk, and mounting one was refused: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	path := filepath.Join(dir, "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond, SpoolSize: 300})
	l.Request(requestRecord(0, "a"))
	written(t, l, 1)
	filler := filepath.Join(dir, "filler")
	fill(t, filler)
	for i := 1; i <= 1000; i++ {
		l.Request(requestRecord(i, "a"))
	}
	waitFor(t, "the spool full", func() bool { return l.Status().Spooled == 300 && l.Status().Dropped == 700 })
	if d := l.Degraded(); !strings.Contains(d, "not being written (300 wait in the spool)") || !strings.Contains(d, "full") {
		t.Errorf("Degraded() = %q while the disk is full", d)
	}
	if n := testutil.ToFloat64(l.m.dropped[kindRequest]); n != 700 {
		t.Errorf("dropped requests counted %v, want the 700 past the spool's 300", n)
	}
	if n := testutil.ToFloat64(l.m.errors); n == 0 {
		t.Error("no write error counted")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	written(t, l, 301)
	// The writer clears the stall just after it counts the rows written.
	waitFor(t, "Degraded to say the drops once the rows are written", func() bool {
		return strings.Contains(l.Degraded(), "dropped within the last minute")
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := requestIDs(t, path); !slices.Equal(ids, idsFrom(0, 301)) {
		t.Errorf("the ledger holds %d rows, want r0 to r300", len(ids))
	}
}

// fill writes the file at path until its file system is full.
func fill(t *testing.T, path string) {
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
