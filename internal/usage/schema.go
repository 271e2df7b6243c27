package usage

import (
	"context"
	"database/sql"
	"fmt"
)

// sqliteMigrations are the local ledger's schema, one step per version:
// step i takes a database from version i to i+1 (PRAGMA user_version). A
// step is only ever appended, never changed: databases in the field have
// run the old ones. Times are Unix microseconds, durations microseconds.
var sqliteMigrations = []string{
	`CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
	CREATE TABLE requests (
		seq INTEGER PRIMARY KEY,
		request_id TEXT NOT NULL,
		arrived_us INTEGER NOT NULL,
		ended_us INTEGER NOT NULL,
		tenant TEXT NOT NULL,
		model TEXT NOT NULL,
		profile TEXT NOT NULL,
		pool TEXT NOT NULL,
		status INTEGER NOT NULL,
		outcome TEXT NOT NULL,
		stream INTEGER NOT NULL,
		prompt_tokens INTEGER NOT NULL,
		completion_tokens INTEGER NOT NULL,
		tokens_estimated INTEGER NOT NULL,
		queue_wait_us INTEGER NOT NULL,
		ttft_us INTEGER NOT NULL,
		duration_us INTEGER NOT NULL,
		caused_swap INTEGER NOT NULL,
		shipped INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX requests_ended ON requests (ended_us);
	CREATE INDEX requests_unshipped ON requests (seq) WHERE shipped = 0;
	CREATE TABLE intervals (
		seq INTEGER PRIMARY KEY,
		pool TEXT NOT NULL,
		activity TEXT NOT NULL,
		profile TEXT NOT NULL,
		gpus TEXT NOT NULL,
		gpu_model TEXT NOT NULL,
		start_us INTEGER NOT NULL,
		end_us INTEGER NOT NULL,
		is_open INTEGER NOT NULL DEFAULT 0,
		shipped INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX intervals_end ON intervals (end_us);
	CREATE INDEX intervals_unshipped ON intervals (seq) WHERE shipped = 0;`,
}

// migrateSQLite brings db to the latest schema, each step in its own
// transaction, and refuses a database written by a newer poold.
func migrateSQLite(ctx context.Context, db *sql.DB) error {
	var v int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		return fmt.Errorf("reading the ledger's schema version: %w", err)
	}
	if v > len(sqliteMigrations) {
		return fmt.Errorf("the ledger's schema is version %d, newer than this poold's %d", v, len(sqliteMigrations))
	}
	for ; v < len(sqliteMigrations); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, sqliteMigrations[v])
		if err == nil {
			// PRAGMA takes no parameters; v is ours.
			_, err = tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1))
		}
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil {
			return fmt.Errorf("migrating the ledger's schema to version %d: %w", v+1, err)
		}
	}
	return nil
}
