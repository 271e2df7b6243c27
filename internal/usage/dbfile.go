package usage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// store is one open database file: the writer's connection, the ledger's
// identity kept in it, and the file itself, held open to tell whether the
// path still names it. The writer opens and closes stores; the shipper
// uses the one current when it begins a round.
type store struct {
	db      *sql.DB
	id      string   // the ledger's identity, random, kept in its meta table
	file    *os.File // the database file as SQLite opened it
	insReq  *sql.Stmt
	insReqs *sql.Stmt
	// marks are the spool's marks kept in meta (spool.go): for each run
	// of poold that spooled rows, the last of them written here. Owned by
	// the writer.
	marks map[string]uint64
}

// fileFault is what is wrong with the database file at the path: it is not
// the file open any more (kind "deleted", "replaced") or it is "corrupt",
// as why says. Rows written to the open file since are written again to
// the file at the path.
type fileFault struct {
	kind string
	why  string
}

func (f *fileFault) Error() string {
	if f.kind == faultCorrupt {
		return "the usage database file is corrupt: " + f.why
	}
	return "the usage database file was " + f.kind
}

// The kinds of fileFault.
const (
	faultDeleted  = "deleted"
	faultReplaced = "replaced"
	faultCorrupt  = "corrupt"
)

// sqliteHeader begins every SQLite database file.
const sqliteHeader = "SQLite format 3\x00"

// openStore opens (creating and migrating) the database at path. fresh
// says the file may not be the one the writer had open: intervals a
// predecessor left open are closed at their last checkpoint. A corrupt
// file is moved aside and a new one created in its place.
func openStore(ctx context.Context, path string, fresh bool, log *slog.Logger) (*store, error) {
	st, err := tryOpenStore(ctx, path, fresh, log)
	if err != nil && isCorrupt(err) {
		if err := moveAside(path, &fileFault{kind: faultCorrupt, why: err.Error()}, log); err != nil {
			return nil, err
		}
		st, err = tryOpenStore(ctx, path, true, log)
	}
	if err != nil {
		return nil, fmt.Errorf("usage ledger %s: %w", path, err)
	}
	return st, nil
}

func tryOpenStore(ctx context.Context, path string, fresh bool, log *slog.Logger) (*store, error) {
	db, err := openSQLite(path, false)
	if err != nil {
		return nil, err
	}
	st := &store{db: db}
	if err = st.init(ctx, fresh, log); err == nil {
		st.file, err = os.Open(path)
	}
	if err != nil {
		st.close()
		return nil, err
	}
	return st, nil
}

// init migrates the schema, reads or makes the ledger's id and the spool's
// marks, closes leftover open intervals when fresh and prepares the
// writer's statements.
func (st *store) init(ctx context.Context, fresh bool, log *slog.Logger) error {
	if err := migrateSQLite(ctx, st.db); err != nil {
		return err
	}
	err := st.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'ledger'`).Scan(&st.id)
	if errors.Is(err, sql.ErrNoRows) {
		st.id = randomID()
		_, err = st.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('ledger', ?)`, st.id)
	}
	if err != nil {
		return fmt.Errorf("ledger id: %w", err)
	}
	if st.marks, err = readMarks(ctx, st.db); err != nil {
		return fmt.Errorf("spool marks: %w", err)
	}
	if fresh {
		res, err := st.db.ExecContext(ctx, `UPDATE intervals SET is_open = 0 WHERE is_open = 1`)
		if err != nil {
			return fmt.Errorf("closing intervals left open: %w", err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			log.Warn("closed pool intervals left open by a previous run at their last checkpoint", "intervals", n)
		}
	}
	if st.insReq, err = st.db.PrepareContext(ctx, insertRequests(1)); err != nil {
		return err
	}
	st.insReqs, err = st.db.PrepareContext(ctx, insertRequests(rowsPerInsert))
	return err
}

// readMarks reads the spool's marks from meta, where each is a row
// ('spool:' run, its last row's number).
func readMarks(ctx context.Context, db *sql.DB) (map[string]uint64, error) {
	rows, err := db.QueryContext(ctx, `SELECT key, value FROM meta WHERE key LIKE 'spool:%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	marks := map[string]uint64{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		marks[strings.TrimPrefix(k, "spool:")] = n
	}
	return marks, rows.Err()
}

// close closes the connection, then the file (closing a descriptor of the
// file releases the process's locks on it, SQLite's included).
func (st *store) close() {
	_ = st.db.Close()
	if st.file != nil {
		_ = st.file.Close()
	}
}

// fault checks the file at path against the open one: nil while it is the
// same file and its header is SQLite's. A path that cannot be checked (a
// directory that cannot be read) is not a fault: the next commit tells.
func (st *store) fault(path string) *fileFault {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &fileFault{kind: faultDeleted}
	}
	mine, merr := st.file.Stat()
	if err != nil || merr != nil {
		return nil
	}
	if !os.SameFile(fi, mine) {
		return &fileFault{kind: faultReplaced}
	}
	var hdr [len(sqliteHeader)]byte
	if n, _ := st.file.ReadAt(hdr[:], 0); n == len(hdr) && string(hdr[:]) != sqliteHeader {
		return &fileFault{kind: faultCorrupt, why: "its header is not SQLite's"}
	}
	return nil
}

// isCorrupt reports an error of SQLite's that says the file is not a sound
// database.
func isCorrupt(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff // the primary code of an extended one
	return code == sqlite3.SQLITE_CORRUPT || code == sqlite3.SQLITE_NOTADB
}

// moveAside moves what is left of a faulty database out of the path's way,
// once it is closed, to path.KIND-TIME, and logs it at ERROR: a corrupt
// file with its WAL and shared-memory files (-wal, -shm); after a deletion
// or a replacement, the old file's WAL and shared-memory files, which
// SQLite leaves when its file has moved and which would otherwise be read
// as the new file's.
func moveAside(path string, f *fileFault, log *slog.Logger) error {
	aside := path + "." + f.kind + "-" + time.Now().UTC().Format("20060102T150405.000Z")
	if f.kind == faultCorrupt {
		if err := os.Rename(path, aside); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("usage ledger %s is corrupt (%s) and cannot be moved aside: %w", path, f.why, err)
		}
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Rename(path+suffix, aside+suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("usage ledger: moving %s aside: %w", path+suffix, err)
		}
	}
	if f.kind == faultCorrupt {
		log.Error("usage ledger: the database is corrupt: moved aside; a new one is started at its path", "path", path, "moved_to", aside, "err", f.why)
	} else {
		log.Error("usage ledger: the database file was "+f.kind+": its WAL and shared-memory files moved aside", "path", path, "moved_to", aside)
	}
	return nil
}
