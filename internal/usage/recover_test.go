package usage

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// waitFor polls cond every 10 ms until it holds, failing the test after
// 20 s with what.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// written waits until the ledger has committed n request rows.
func written(t *testing.T, l *Ledger, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d request rows written; status %+v", n, l.Status()), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.written[kindRequest] == uint64(n)
	})
}

// requestIDs are the request ids of the ledger at path, in seq order.
func requestIDs(t *testing.T, path string) []string {
	t.Helper()
	reqs, _ := readAll(t, path)
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		ids[i] = r.RequestID
	}
	return ids
}

// idsFrom are r<from> to r<to-1>.
func idsFrom(from, to int) []string {
	var ids []string
	for i := from; i < to; i++ {
		ids = append(ids, fmt.Sprintf("r%d", i))
	}
	return ids
}

func TestLedgerWritesToANewFileWhenItsFileIsDeleted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	for i := range 100 {
		l.Request(requestRecord(i, "a"))
	}
	written(t, l, 100)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 300; i++ {
		l.Request(requestRecord(i, "a"))
	}
	written(t, l, 300)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart finds them at the path.
	openLedger(t, Options{Path: path}).Close()
	if ids := requestIDs(t, path); !slices.Equal(ids, idsFrom(100, 300)) {
		t.Errorf("after the deletion and a restart the file at the path holds %d rows (%v...), want r100 to r299", len(ids), ids[:min(len(ids), 3)])
	}
}

func TestLedgerWritesToTheFileThatReplacedItsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	for i := range 100 {
		l.Request(requestRecord(i, "a"))
	}
	written(t, l, 100)
	// Another ledger (a backup restored, say) renamed onto the path.
	other := openLedger(t, Options{Path: filepath.Join(dir, "other.db")})
	other.Request(requestRecord(1000, "a"))
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "other.db"), path); err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 300; i++ {
		l.Request(requestRecord(i, "a"))
	}
	written(t, l, 300)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := requestIDs(t, path); !slices.Equal(ids, append([]string{"r1000"}, idsFrom(100, 300)...)) {
		t.Errorf("the file that replaced the ledger's holds %d rows (%v...), want r1000 then r100 to r299", len(ids), ids[:min(len(ids), 3)])
	}
}

func TestLedgerWaitsForItsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	l.Request(requestRecord(0, "a"))
	written(t, l, 1)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 100; i++ {
		l.Request(requestRecord(i, "a"))
	}
	waitFor(t, "100 rows waiting", func() bool { return l.Status().Spooled == 100 })
	if d := l.Degraded(); !strings.Contains(d, "not being written (100 wait in the spool)") {
		t.Errorf("Degraded() = %q without a directory", d)
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	written(t, l, 101)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := requestIDs(t, path); !slices.Equal(ids, idsFrom(1, 101)) {
		t.Errorf("once the directory is back the ledger holds %d rows, want r1 to r100", len(ids))
	}
}

func TestLedgerMovesACorruptFileAside(t *testing.T) {
	for _, c := range []struct {
		name    string
		corrupt func(t *testing.T, path string)
	}{
		{"header", corruptHeader}, // the writer's check sees it
		{"pages", corruptPages},   // SQLite does, reading them
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "usage.db")
			l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
			for i := range 2000 {
				l.Request(requestRecord(i, "a"))
			}
			written(t, l, 2000)
			c.corrupt(t, path)
			for i := 2000; i < 2200; i++ {
				l.Request(requestRecord(i, "a"))
			}
			written(t, l, 2200)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if ids := requestIDs(t, path); !slices.Equal(ids, idsFrom(2000, 2200)) {
				t.Errorf("the new file holds %d rows (%v...), want r2000 to r2199", len(ids), ids[:min(len(ids), 3)])
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) == 0 {
				t.Fatal("the corrupt file was not moved aside")
			}

			// A corrupt file found at a start is moved aside too, and the
			// ledger opens.
			corruptHeader(t, path)
			l = openLedger(t, Options{Path: path})
			l.Request(requestRecord(1, "a"))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if ids := requestIDs(t, path); !slices.Equal(ids, []string{"r1"}) {
				t.Errorf("after a start on a corrupt file: %v", ids)
			}
			if again, _ := filepath.Glob(path + ".corrupt-*"); len(again) <= len(aside) {
				t.Errorf("moved aside at the start: %v, before %v", again, aside)
			}
		})
	}
}

// corruptHeader overwrites the start of the file at path.
func corruptHeader(t *testing.T, path string) {
	t.Helper()
	overwrite(t, path, 0, 4096)
}

// corruptPages checkpoints the database at path, so that its pages are in
// the file, and overwrites all but the first.
func corruptPages(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var busy, frames, done int
	if err := db.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &frames, &done); err != nil || busy != 0 {
		t.Fatalf("checkpoint: busy %d, %v", busy, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, path, 4096, int(fi.Size())-4096)
}

// overwrite writes n bytes of 0xff at off in the file at path.
func overwrite(t *testing.T, path string, off int64, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xff}, n), off); err != nil {
		t.Fatal(err)
	}
}

// refuseWrites makes every INSERT into the requests of the database at path
// fail (on), or succeed again: a fault the writer sees as any failed commit.
func refuseWrites(t *testing.T, path string, on bool) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := `DROP TRIGGER refuse`
	if on {
		q = `CREATE TRIGGER refuse BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`
	}
	if _, err := db.Exec(q); err != nil {
		t.Fatal(err)
	}
}

func TestLedgerSpoolsToAFileThroughAFailureAndARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	refuseWrites(t, path, true)
	for i := range 50 {
		l.Request(requestRecord(i, "a"))
	}
	waitFor(t, "50 rows in the spool", func() bool { return l.Status().Spooled == 50 })
	if d := l.Degraded(); !strings.Contains(d, "not being written (50 wait in the spool)") || !strings.Contains(d, "refused by the test") {
		t.Errorf("Degraded() = %q", d)
	}
	if err := l.Close(); err != nil { // its last attempt fails too: the rows stay in the spool file
		t.Fatal(err)
	}
	if st := l.Status(); st.Dropped != 0 {
		t.Fatalf("%d rows dropped at Close, want them in the spool file", st.Dropped)
	}
	// The same rows twice in the file (a crash between a replay and the
	// file's removal) are written once.
	spooled, err := os.ReadFile(path + ".spool")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".spool", append(slices.Clone(spooled), spooled...), 0o600); err != nil {
		t.Fatal(err)
	}
	refuseWrites(t, path, false)
	l = openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	waitFor(t, "the spool replayed", func() bool { return l.Status().Spooled == 0 })
	if d := l.Degraded(); d != "" {
		t.Errorf("Degraded() = %q once the rows are written", d)
	}
	l.Close()
	if _, err := os.Stat(path + ".spool"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the spool file stays after its replay: %v", err)
	}
	// And a spool file replayed again changes nothing.
	if err := os.WriteFile(path+".spool", spooled, 0o600); err != nil {
		t.Fatal(err)
	}
	openLedger(t, Options{Path: path}).Close()
	if ids := requestIDs(t, path); !slices.Equal(ids, idsFrom(0, 50)) {
		t.Errorf("the ledger holds %d rows, want r0 to r49 once each: %v", len(ids), ids)
	}
}

// Every usage ledger metric the shipped rules use (poold-rules.yml, its
// expressions and annotations) is one the ledger exports.
func TestRulesUseLedgerMetrics(t *testing.T) {
	rules, err := os.ReadFile("../../deploy/prometheus/poold-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	openLedger(t, Options{Registerer: reg, Postgres: "postgres://poold@127.0.0.1:1/none?connect_timeout=1", ShipTimeout: 100 * time.Millisecond})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	used := regexp.MustCompile(`poold_usage_[a-z_]+`).FindAllString(string(rules), -1)
	if len(used) < 3 {
		t.Fatalf("only %d usage metrics in the rules: is the search broken?", len(used))
	}
	for _, name := range used {
		if !exported[name] {
			t.Errorf("the rules use %s, which the ledger does not export", name)
		}
	}
}
