package usage

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"
)

// How the writer deals with a database that does not take rows (docs/usage.md,
// "What can be lost"): before each batch, and after its commit, it checks that
// the path still names the file it has open, with SQLite's header. A file
// deleted or replaced is left (the -wal and -shm SQLite leaves beside it
// moved aside), and the file at the path opened (created when there is
// none); a corrupt one is moved aside and a new one created; the batch that
// went to the old file is written again to the new one. Rows the
// database does not take (a full disk, a read-only file system, any failed commit)
// wait in the spool: the spool file beside the database when it can be
// written, else memory, up to Options.SpoolSize rows; past both they are
// dropped and counted. After a failure the writer opens the database again
// and tries every retryInterval, writing the spool file's rows first.
// Meanwhile Degraded says why, for /health and /ready.

// retryInterval is the wait after a failed write before the next attempt.
const retryInterval = time.Second

// dropWindow is how long Degraded reports dropped rows.
const dropWindow = time.Minute

// save writes rows after those held in memory, BatchSize to a transaction,
// once the database can take them; what it does not take is held. It
// reports whether the database took them all.
func (l *Ledger) save(rows []row, now time.Time) bool {
	if len(l.held) > 0 {
		rows = append(l.held, rows...)
		l.held = nil
	}
	ok := l.writable(now)
	for ok && len(rows) > 0 {
		n := min(len(rows), l.opts.BatchSize)
		if ok = l.writeBatch(rows[:n]); ok {
			rows = rows[n:]
		}
	}
	l.hold(rows)
	l.settle()
	return ok
}

// writable makes the database ready for rows and reports whether it is: a
// faulty file is replaced at once; after a failure, the database is opened
// again once retryInterval has passed; the spool file's rows go first.
func (l *Ledger) writable(now time.Time) bool {
	switch f := l.fault(); {
	case f != nil:
		l.replace(f)
	case l.retryAt.IsZero():
	case now.Before(l.retryAt):
		return false
	default:
		l.reopen(nil)
	}
	return l.cur != nil && l.replay()
}

// fault is what is wrong with the open database's file; nil when nothing
// is or none is open.
func (l *Ledger) fault() *fileFault {
	if l.cur == nil {
		return nil
	}
	return l.cur.fault(l.opts.Path)
}

// writeBatch writes one batch; one that went to a file the path no longer
// names is written again, once, to the file there.
func (l *Ledger) writeBatch(batch []row) bool {
	err := l.write(batch)
	if f, ok := errors.AsType[*fileFault](err); ok {
		l.replace(f)
		if l.cur == nil {
			return false
		}
		err = l.write(batch)
	}
	if err != nil {
		l.failed(err)
		return false
	}
	l.retryAt = time.Time{}
	return true
}

// replace leaves a faulty database file, logged at ERROR, and opens the
// file at the path, or creates it.
func (l *Ledger) replace(f *fileFault) {
	l.log.Error("usage ledger: "+f.Error()+"; rows are written to the file at its path from now on", "path", l.opts.Path)
	l.reopen(f)
}

// reopen closes the open database, moves what is left of a faulty one
// aside (moveAside), and opens the file at the path. When that is not the
// last file opened, intervals left open in it are closed, as at a start.
func (l *Ledger) reopen(f *fileFault) {
	if old := l.cur; old != nil {
		l.setStore(nil)
		old.close()
	}
	if f != nil {
		if err := moveAside(l.opts.Path, f, l.log); err != nil {
			l.failed(err)
			return
		}
	}
	fi, err := os.Stat(l.opts.Path)
	fresh := err != nil || l.lastFile == nil || !os.SameFile(fi, l.lastFile)
	st, err := openStore(context.Background(), l.opts.Path, fresh, l.log)
	if err != nil {
		l.failed(err)
		return
	}
	l.lastFile, _ = st.file.Stat()
	l.setStore(st)
}

func (l *Ledger) setStore(st *store) {
	l.mu.Lock()
	l.cur = st
	l.mu.Unlock()
}

// failed notes that rows could not be written: they wait in the spool,
// Degraded says why, and the writer tries again after retryInterval.
func (l *Ledger) failed(err error) {
	l.retryAt = time.Now().Add(retryInterval)
	l.mu.Lock()
	l.stalled = err
	l.mu.Unlock()
}

// replay writes the spool file's rows, before any newer one, and removes
// the file once they all are. It reports whether the file is empty.
func (l *Ledger) replay() bool {
	if l.spool.rows == 0 {
		return true
	}
	rows, err := l.spool.read(l.log)
	if err != nil {
		l.failed(err)
		return false
	}
	for b := rows; len(b) > 0; {
		n := min(len(b), l.opts.BatchSize)
		if !l.writeBatch(b[:n]) {
			return false
		}
		b = b[n:]
	}
	if err := l.spool.clear(); err != nil {
		// Its rows are written: their marks keep them from being
		// written again.
		l.log.Error("usage ledger: the spooled rows are written but the spool file stays", "err", err)
	}
	l.log.Warn("usage ledger: the rows that waited in the spool file are written", "rows", len(rows), "path", l.opts.Path)
	return true
}

// hold keeps rows the database did not take: in the spool file when it
// can be written, else in memory, up to SpoolSize rows; the rest are
// dropped and counted. Each row gets its place in the spool first.
func (l *Ledger) hold(rows []row) {
	if len(rows) > 0 {
		for i := range rows {
			if rows[i].Run == "" {
				l.spoolN++
				rows[i].Run, rows[i].N = l.runID, l.spoolN
			}
		}
		if err := l.spool.append(rows); err != nil {
			keep := min(len(rows), l.opts.SpoolSize)
			l.held = slices.Clone(rows[:keep])
			l.drop(rows[keep:], err)
		}
	}
}

// settle publishes the spool's size, and clears (and logs the end of) the
// failure Degraded gives once nothing waits and the last attempt
// succeeded.
func (l *Ledger) settle() {
	l.mu.Lock()
	l.spooled = len(l.held) + l.spool.rows
	recovered := l.stalled != nil && l.spooled == 0 && l.retryAt.IsZero()
	if recovered {
		l.stalled = nil
	}
	l.mu.Unlock()
	if recovered {
		l.log.Warn("usage ledger: rows are written again; none waits in the spool", "path", l.opts.Path)
	}
}

// drop counts and logs rows lost: neither the database nor the spool took
// them. The log of a lasting loss is one line every 10 s.
func (l *Ledger) drop(rows []row, cause error) {
	if n := l.countDropped(rows); n[kindRequest]+n[kindInterval] > 0 {
		l.dropLog.Do(func() {
			l.log.Error("usage ledger: rows dropped: the database did not take them and the spool is full", "requests", n[kindRequest], "intervals", n[kindInterval], "err", cause)
		})
	}
}

// abandon drops, at Close, what waits in memory: the database and the
// spool file did not take it. Its log line is never held back: no scrape
// will see the count.
func (l *Ledger) abandon() {
	if n := l.countDropped(l.held); n[kindRequest]+n[kindInterval] > 0 {
		l.log.Error("usage ledger: rows lost at shutdown: neither the database nor the spool file took them", "requests", n[kindRequest], "intervals", n[kindInterval])
	}
	l.held = nil
}

// countDropped counts rows as dropped, by kind, and returns the counts.
func (l *Ledger) countDropped(rows []row) [2]uint64 {
	var n [2]uint64
	for i := range rows {
		n[rows[i].kind()]++
	}
	l.mu.Lock()
	for k := range n {
		l.dropped[k] += n[k]
	}
	if len(rows) > 0 {
		l.droppedAt = time.Now()
	}
	l.mu.Unlock()
	for k := range n {
		l.m.dropped[k].Add(float64(n[k]))
	}
	return n
}

// Degraded says why rows are not all being written, for /health and
// /ready: they wait in the spool since a write failed, or rows were
// dropped within the last minute. It is "" when neither.
func (l *Ledger) Degraded() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.stalled != nil:
		return fmt.Sprintf("usage ledger rows are not being written (%d wait in the spool): %v", l.spooled, l.stalled)
	case !l.droppedAt.IsZero() && time.Since(l.droppedAt) < dropWindow:
		return "usage ledger rows were dropped within the last minute (poold_usage_records_dropped_total)"
	}
	return ""
}

// writeMarks keeps in meta the spool's marks that moved from was.
func writeMarks(tx *sql.Tx, marks, was map[string]uint64) error {
	for run, n := range marks {
		if n == was[run] {
			continue
		}
		if _, err := tx.Exec(`INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`,
			"spool:"+run, strconv.FormatUint(n, 10)); err != nil {
			return err
		}
	}
	return nil
}

// randomID is 16 random hexadecimal digits.
func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
