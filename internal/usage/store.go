package usage

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poold/poold/internal/activity"
)

// Source is where reports read rows: a host's ledger (SQLite) or the
// fleet's PostgreSQL.
type Source interface {
	// Intervals returns the intervals that overlap [since, until), ordered
	// by host, pool and start.
	Intervals(ctx context.Context, since, until time.Time) ([]Interval, error)
	// Requests returns the requests whose [arrival, end] overlaps [since,
	// until), in seq order.
	Requests(ctx context.Context, since, until time.Time) ([]Request, error)
	Close() error
}

// OpenReader opens the ledger at path for reading, never creating it nor
// writing to it: it works beside a running poold (WAL) and on the state
// directory of a stopped one.
func OpenReader(ctx context.Context, path string) (Source, error) {
	db, err := openSQLite(path, true)
	if err != nil {
		return nil, err
	}
	var v int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage ledger %s: %w", path, err)
	}
	if v == 0 || v > len(sqliteMigrations) {
		db.Close()
		return nil, fmt.Errorf("usage ledger %s: schema version %d, this poold reads 1 to %d", path, v, len(sqliteMigrations))
	}
	return &sqliteSource{db: db}, nil
}

type sqliteSource struct{ db *sql.DB }

func (s *sqliteSource) Close() error { return s.db.Close() }

func (s *sqliteSource) Intervals(ctx context.Context, since, until time.Time) ([]Interval, error) {
	return readIntervals(ctx, s.db, `WHERE end_us > ? AND start_us < ? ORDER BY pool, start_us`, since.UnixMicro(), until.UnixMicro())
}

func (s *sqliteSource) Requests(ctx context.Context, since, until time.Time) ([]Request, error) {
	return readRequests(ctx, s.db, `WHERE ended_us >= ? AND arrived_us < ? ORDER BY seq`, since.UnixMicro(), until.UnixMicro())
}

func readRequests(ctx context.Context, db *sql.DB, where string, args ...any) ([]Request, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, request_id, arrived_us, ended_us, tenant, model, profile, pool, status, outcome,
		stream, prompt_tokens, completion_tokens, tokens_estimated, queue_wait_us, ttft_us, duration_us, caused_swap FROM requests `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Request
	for rows.Next() {
		var r Request
		var arrived, ended, wait, ttft, dur int64
		if err := rows.Scan(&r.Seq, &r.RequestID, &arrived, &ended, &r.Tenant, &r.Model, &r.Profile, &r.Pool, &r.Status, &r.Outcome,
			&r.Stream, &r.PromptTokens, &r.CompletionTokens, &r.TokensEstimated, &wait, &ttft, &dur, &r.CausedSwap); err != nil {
			return nil, err
		}
		r.Arrived, r.Ended = time.UnixMicro(arrived).UTC(), time.UnixMicro(ended).UTC()
		r.QueueWait, r.TTFT, r.Duration = time.Duration(wait)*time.Microsecond, time.Duration(ttft)*time.Microsecond, time.Duration(dur)*time.Microsecond
		out = append(out, r)
	}
	return out, rows.Err()
}

func readIntervals(ctx context.Context, db *sql.DB, where string, args ...any) ([]Interval, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, pool, activity, profile, gpus, gpu_model, start_us, end_us, is_open FROM intervals `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Interval
	for rows.Next() {
		var iv Interval
		var act, gpus string
		var start, end int64
		if err := rows.Scan(&iv.Seq, &iv.Pool, &act, &iv.Profile, &gpus, &iv.GPUModel, &start, &end, &iv.Open); err != nil {
			return nil, err
		}
		iv.Activity = activity.Activity(act)
		if iv.GPUs, err = parseGPUs(gpus); err != nil {
			return nil, err
		}
		iv.Start, iv.End = time.UnixMicro(start).UTC(), time.UnixMicro(end).UTC()
		out = append(out, iv)
	}
	return out, rows.Err()
}

// OpenPostgres connects to the fleet's PostgreSQL for reports. It creates
// nothing: the poolds that ship create and migrate the schema.
func OpenPostgres(ctx context.Context, dsn string) (Source, error) {
	if err := CheckDSN(dsn); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL %s: %w", pgTarget(dsn), err)
	}
	return &pgSource{conn: conn}, nil
}

type pgSource struct{ conn *pgx.Conn }

func (s *pgSource) Close() error { return s.conn.Close(context.Background()) }

func (s *pgSource) Intervals(ctx context.Context, since, until time.Time) ([]Interval, error) {
	rows, err := s.conn.Query(ctx, `SELECT host, seq, pool, activity, profile, gpus, gpu_model, started_at, ended_at
		FROM poold_usage_intervals WHERE ended_at > $1 AND started_at < $2 ORDER BY host, pool, started_at`, since, until)
	if err != nil {
		return nil, err
	}
	var out []Interval
	for rows.Next() {
		var iv Interval
		var act string
		var gpus []int32
		if err := rows.Scan(&iv.Host, &iv.Seq, &iv.Pool, &act, &iv.Profile, &gpus, &iv.GPUModel, &iv.Start, &iv.End); err != nil {
			rows.Close()
			return nil, err
		}
		iv.Activity = activity.Activity(act)
		for _, g := range gpus {
			iv.GPUs = append(iv.GPUs, int(g))
		}
		iv.Start, iv.End = iv.Start.UTC(), iv.End.UTC()
		out = append(out, iv)
	}
	return out, rows.Err()
}

func (s *pgSource) Requests(ctx context.Context, since, until time.Time) ([]Request, error) {
	rows, err := s.conn.Query(ctx, `SELECT host, seq, request_id, arrived_at, ended_at, tenant, model, profile, pool, status, outcome,
		stream, prompt_tokens, completion_tokens, tokens_estimated, queue_wait_us, ttft_us, duration_us, caused_swap
		FROM poold_usage_requests WHERE ended_at >= $1 AND arrived_at < $2 ORDER BY host, ledger, seq`, since, until)
	if err != nil {
		return nil, err
	}
	var out []Request
	for rows.Next() {
		var r Request
		var wait, ttft, dur int64
		var status int32
		if err := rows.Scan(&r.Host, &r.Seq, &r.RequestID, &r.Arrived, &r.Ended, &r.Tenant, &r.Model, &r.Profile, &r.Pool, &status, &r.Outcome,
			&r.Stream, &r.PromptTokens, &r.CompletionTokens, &r.TokensEstimated, &wait, &ttft, &dur, &r.CausedSwap); err != nil {
			rows.Close()
			return nil, err
		}
		r.Status = int(status)
		r.Arrived, r.Ended = r.Arrived.UTC(), r.Ended.UTC()
		r.QueueWait, r.TTFT, r.Duration = time.Duration(wait)*time.Microsecond, time.Duration(ttft)*time.Microsecond, time.Duration(dur)*time.Microsecond
		out = append(out, r)
	}
	return out, rows.Err()
}
