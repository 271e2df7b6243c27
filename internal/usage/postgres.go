package usage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/statusapi"
)

// postgresMigrations are the fleet schema, one step per version, kept in
// poold_usage_schema; like sqliteMigrations, only ever appended. Rows are
// keyed by the host, the ledger's id and the row's seq in that ledger, so a
// retry never duplicates a row and two ledgers never collide.
var postgresMigrations = []string{
	`CREATE TABLE poold_usage_requests (
		host text NOT NULL,
		ledger text NOT NULL,
		seq bigint NOT NULL,
		request_id text NOT NULL,
		arrived_at timestamptz NOT NULL,
		ended_at timestamptz NOT NULL,
		tenant text NOT NULL,
		model text NOT NULL,
		profile text NOT NULL,
		pool text NOT NULL,
		status integer NOT NULL,
		outcome text NOT NULL,
		stream boolean NOT NULL,
		prompt_tokens bigint NOT NULL,
		completion_tokens bigint NOT NULL,
		tokens_estimated boolean NOT NULL,
		queue_wait_us bigint NOT NULL,
		ttft_us bigint NOT NULL,
		duration_us bigint NOT NULL,
		caused_swap boolean NOT NULL,
		PRIMARY KEY (host, ledger, seq)
	);
	CREATE INDEX poold_usage_requests_ended ON poold_usage_requests (ended_at);
	CREATE TABLE poold_usage_intervals (
		host text NOT NULL,
		ledger text NOT NULL,
		seq bigint NOT NULL,
		pool text NOT NULL,
		activity text NOT NULL,
		profile text NOT NULL,
		gpus integer[] NOT NULL,
		gpu_model text NOT NULL,
		started_at timestamptz NOT NULL,
		ended_at timestamptz NOT NULL,
		PRIMARY KEY (host, ledger, seq)
	);
	CREATE INDEX poold_usage_intervals_ended ON poold_usage_intervals (ended_at);`,
}

// migrationLock is the advisory lock that serialises the poolds of a fleet
// migrating one database at once.
const migrationLock = 74_700_121

// MigratePostgres brings the database conn is connected to to the latest
// fleet schema, and refuses one written by a newer poold.
func MigratePostgres(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("locking the usage schema: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS poold_usage_schema (version integer NOT NULL)`); err != nil {
		return fmt.Errorf("creating the usage schema's version table: %w", err)
	}
	var v int
	err = tx.QueryRow(ctx, `SELECT version FROM poold_usage_schema`).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = tx.Exec(ctx, `INSERT INTO poold_usage_schema (version) VALUES (0)`)
	}
	if err != nil {
		return fmt.Errorf("reading the usage schema's version: %w", err)
	}
	if v > len(postgresMigrations) {
		return fmt.Errorf("the PostgreSQL usage schema is version %d, newer than this poold's %d", v, len(postgresMigrations))
	}
	for ; v < len(postgresMigrations); v++ {
		if _, err := tx.Exec(ctx, postgresMigrations[v]); err != nil {
			return fmt.Errorf("migrating the PostgreSQL usage schema to version %d: %w", v+1, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE poold_usage_schema SET version = $1`, v); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// pgTarget names a DSN's server and database for logs and /status, without
// its credentials.
func pgTarget(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "(invalid DSN)"
	}
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + cfg.Database
}

// CheckDSN reports a DSN that cannot be parsed, without echoing it (it may
// hold a password).
func CheckDSN(dsn string) error {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return errors.New("not a valid PostgreSQL connection string (key=value or postgres:// URL)")
	}
	return nil
}

// shipBatch is the most rows of each kind shipped in one transaction.
const shipBatch = 1000

// shipper copies the ledger's rows to PostgreSQL in seq order, marks them
// shipped once PostgreSQL has committed them, and retries with a backoff
// while PostgreSQL is away. Its goroutine is the Ledger's: Open starts it,
// Close ends it after one last bounded attempt.
type shipper struct {
	l      *Ledger
	dsn    string
	target string
	kick   chan struct{} // buffered(1): rows were committed
	stop   chan struct{} // closed by close
	done   chan struct{} // closed when run has ended
	ctx    context.Context
	cancel context.CancelFunc
	conn   *pgx.Conn // owned by run; nil when not connected

	mu       sync.Mutex // guards the fields below
	backlog  [2]int64   // rows not shipped yet, by kind
	oldest   time.Time  // end of the oldest of them; zero when none
	lastShip time.Time
	lastErr  error

	shipped [2]prometheus.Counter
	errors  prometheus.Counter
}

func newShipper(l *Ledger, dsn string) *shipper {
	s := &shipper{l: l, dsn: dsn, target: pgTarget(dsn), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	shipped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poold_usage_rows_shipped_total", Help: "Usage ledger rows committed to PostgreSQL, by kind (request, interval).",
	}, []string{"kind"})
	for k, name := range rowNames {
		s.shipped[k] = shipped.WithLabelValues(name)
	}
	s.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "poold_usage_ship_errors_total", Help: "Failed attempts to ship usage rows to PostgreSQL.",
	})
	if reg := l.opts.Registerer; reg != nil {
		backlog := prometheus.NewDesc("poold_usage_unshipped_rows", "Usage ledger rows not shipped to PostgreSQL yet, by kind.", []string{"kind"}, nil)
		age := prometheus.NewDesc("poold_usage_unshipped_age_seconds", "Age of the oldest usage row not shipped to PostgreSQL yet (by its end); 0 when none waits.", nil, nil)
		reg.MustRegister(shipped, s.errors, &backlogCollector{s: s, rows: backlog, age: age})
	}
	return s
}

// wake tells the shipper that rows were committed.
func (s *shipper) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// close ends run: one last attempt to ship the rest, bounded by ShipTimeout.
func (s *shipper) close() {
	close(s.stop)
	t := time.NewTimer(s.l.opts.ShipTimeout)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
		s.cancel()
		<-s.done
	}
	s.cancel()
}

// maxShipBackoff caps the wait between failed attempts.
const maxShipBackoff = 30 * time.Second

func (s *shipper) run() {
	defer close(s.done)
	defer func() {
		if s.conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.conn.Close(ctx)
			cancel()
		}
	}()
	backoff := time.Second
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-s.stop:
			if err := s.drain(); err != nil {
				s.l.log.Warn("usage rows left unshipped at shutdown; the next start ships them", "postgres", s.target, "err", err)
			}
			return
		case <-s.kick:
		case <-timer.C:
		}
		err := s.drain()
		if err != nil {
			timer.Reset(backoff)
			backoff = min(2*backoff, maxShipBackoff)
			continue
		}
		backoff = time.Second
		timer.Reset(10 * time.Second) // the backlog's age, refreshed while idle
	}
}

// drain ships until nothing is left or an attempt fails, then refreshes the
// backlog figures.
func (s *shipper) drain() error {
	var err error
	for {
		var n int
		n, err = s.shipOnce()
		if err != nil || n == 0 {
			break
		}
	}
	s.refreshBacklog()
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	if err != nil {
		s.errors.Inc()
		s.l.log.Warn("shipping usage rows to PostgreSQL failed; they wait in the local ledger", "postgres", s.target, "err", err)
		if s.conn != nil {
			_ = s.conn.Close(context.Background())
			s.conn = nil
		}
	}
	return err
}

// shipOnce ships one batch of each kind in one PostgreSQL transaction, and
// marks them shipped once it committed. It returns the rows shipped.
//
// It works on the database open when it begins: rows read from one are
// marked shipped in that one, under its ledger id, even if the writer
// replaces it meanwhile (a closed one fails the round).
func (s *shipper) shipOnce() (int, error) {
	st := s.l.store()
	if st == nil {
		return 0, errors.New("no usage database is open")
	}
	reqs, err := readRequests(s.ctx, st.db, `WHERE shipped = 0 ORDER BY seq LIMIT ?`, shipBatch)
	if err != nil {
		return 0, fmt.Errorf("reading unshipped requests: %w", err)
	}
	ivs, err := readIntervals(s.ctx, st.db, `WHERE shipped = 0 AND is_open = 0 ORDER BY seq LIMIT ?`, shipBatch)
	if err != nil {
		return 0, fmt.Errorf("reading unshipped intervals: %w", err)
	}
	if len(reqs)+len(ivs) == 0 {
		return 0, nil
	}
	if s.conn == nil {
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		conn, err := pgx.Connect(ctx, s.dsn)
		if err == nil {
			if err = MigratePostgres(ctx, conn); err != nil {
				_ = conn.Close(ctx)
			}
		}
		cancel()
		if err != nil {
			return 0, fmt.Errorf("connecting: %w", err)
		}
		s.conn = conn
	}
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	host, ledger := s.l.opts.Host, st.id
	if len(reqs) > 0 {
		if err := insertPGRequests(ctx, tx, host, ledger, reqs); err != nil {
			return 0, err
		}
	}
	if len(ivs) > 0 {
		if err := insertPGIntervals(ctx, tx, host, ledger, ivs); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("committing: %w", err)
	}
	// Only now are they PostgreSQL's; if marking them fails, they are
	// shipped again, which changes nothing there.
	if err := s.l.commit(st, "marking rows shipped", func(tx *sql.Tx) error { return markShipped(tx, reqs, ivs) }); err != nil {
		return 0, err
	}
	s.shipped[kindRequest].Add(float64(len(reqs)))
	s.shipped[kindInterval].Add(float64(len(ivs)))
	s.mu.Lock()
	s.lastShip = time.Now()
	s.mu.Unlock()
	return len(reqs) + len(ivs), nil
}

func insertPGRequests(ctx context.Context, tx pgx.Tx, host, ledger string, rs []Request) error {
	n := len(rs)
	seq, prompt, completion, wait, ttft, dur := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	id, tenant, model, prof, pl, outcome := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	arrived, ended := make([]time.Time, n), make([]time.Time, n)
	status := make([]int32, n)
	stream, est, swap := make([]bool, n), make([]bool, n), make([]bool, n)
	for i, r := range rs {
		seq[i], id[i], arrived[i], ended[i] = r.Seq, r.RequestID, r.Arrived, r.Ended
		tenant[i], model[i], prof[i], pl[i] = r.Tenant, r.Model, r.Profile, r.Pool
		status[i], outcome[i], stream[i] = int32(r.Status), r.Outcome, r.Stream
		prompt[i], completion[i], est[i] = r.PromptTokens, r.CompletionTokens, r.TokensEstimated
		wait[i], ttft[i], dur[i], swap[i] = r.QueueWait.Microseconds(), r.TTFT.Microseconds(), r.Duration.Microseconds(), r.CausedSwap
	}
	_, err := tx.Exec(ctx, `INSERT INTO poold_usage_requests (host, ledger, seq, request_id, arrived_at, ended_at, tenant, model,
		profile, pool, status, outcome, stream, prompt_tokens, completion_tokens, tokens_estimated, queue_wait_us, ttft_us, duration_us, caused_swap)
		SELECT $1::text, $2::text, * FROM unnest($3::bigint[], $4::text[], $5::timestamptz[], $6::timestamptz[], $7::text[], $8::text[],
		$9::text[], $10::text[], $11::integer[], $12::text[], $13::boolean[], $14::bigint[], $15::bigint[], $16::boolean[],
		$17::bigint[], $18::bigint[], $19::bigint[], $20::boolean[])
		ON CONFLICT (host, ledger, seq) DO NOTHING`,
		host, ledger, seq, id, arrived, ended, tenant, model, prof, pl, status, outcome, stream, prompt, completion, est, wait, ttft, dur, swap)
	if err != nil {
		return fmt.Errorf("inserting requests: %w", err)
	}
	return nil
}

func insertPGIntervals(ctx context.Context, tx pgx.Tx, host, ledger string, ivs []Interval) error {
	n := len(ivs)
	seq := make([]int64, n)
	pl, act, prof, gpus, model := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	start, end := make([]time.Time, n), make([]time.Time, n)
	for i, iv := range ivs {
		seq[i], pl[i], act[i], prof[i] = iv.Seq, iv.Pool, string(iv.Activity), iv.Profile
		gpus[i], model[i], start[i], end[i] = formatGPUs(iv.GPUs), iv.GPUModel, iv.Start, iv.End
	}
	// unnest cannot yield arrays, so the GPU lists travel as text.
	_, err := tx.Exec(ctx, `INSERT INTO poold_usage_intervals (host, ledger, seq, pool, activity, profile, gpus, gpu_model, started_at, ended_at)
		SELECT $1::text, $2::text, seq, pool, activity, profile, string_to_array(gpus, ',')::integer[], gpu_model, started_at, ended_at
		FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::timestamptz[], $10::timestamptz[])
			AS t(seq, pool, activity, profile, gpus, gpu_model, started_at, ended_at)
		ON CONFLICT (host, ledger, seq) DO NOTHING`,
		host, ledger, seq, pl, act, prof, gpus, model, start, end)
	if err != nil {
		return fmt.Errorf("inserting intervals: %w", err)
	}
	return nil
}

// markShipped marks the rows shipped, by their seq.
func markShipped(tx *sql.Tx, reqs []Request, ivs []Interval) error {
	if len(reqs) > 0 {
		// Requests ship in seq order: every unshipped one up to the last
		// was in the batch.
		if _, err := tx.Exec(`UPDATE requests SET shipped = 1 WHERE shipped = 0 AND seq <= ?`, reqs[len(reqs)-1].Seq); err != nil {
			return err
		}
	}
	if len(ivs) > 0 {
		// Intervals skip the open ones, which may close meanwhile: name each.
		var b strings.Builder
		for i, iv := range ivs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(iv.Seq, 10))
		}
		if _, err := tx.Exec(`UPDATE intervals SET shipped = 1 WHERE seq IN (` + b.String() + `)`); err != nil {
			return err
		}
	}
	return nil
}

// refreshBacklog counts the rows not shipped yet and finds the oldest.
func (s *shipper) refreshBacklog() {
	st := s.l.store()
	if st == nil {
		return
	}
	var n [2]int64
	var oldest [2]int64
	err := st.db.QueryRowContext(s.ctx, `SELECT count(*), coalesce(min(ended_us), 0) FROM requests WHERE shipped = 0`).Scan(&n[0], &oldest[0])
	if err == nil {
		err = st.db.QueryRowContext(s.ctx, `SELECT count(*), coalesce(min(end_us), 0) FROM intervals WHERE shipped = 0 AND is_open = 0`).Scan(&n[1], &oldest[1])
	}
	if err != nil {
		s.l.log.Warn("counting unshipped usage rows", "err", err)
		return
	}
	var at time.Time
	for k := range oldest {
		if n[k] > 0 && (at.IsZero() || time.UnixMicro(oldest[k]).Before(at)) {
			at = time.UnixMicro(oldest[k])
		}
	}
	s.mu.Lock()
	s.backlog, s.oldest = n, at
	s.mu.Unlock()
}

// status is the shipping's part of GET /status.
func (s *shipper) status() *statusapi.Shipping {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &statusapi.Shipping{Target: s.target, BacklogRows: s.backlog[0] + s.backlog[1]}
	if !s.oldest.IsZero() {
		st.BacklogAgeSeconds = time.Since(s.oldest).Seconds()
	}
	if !s.lastShip.IsZero() {
		t := s.lastShip
		st.LastShippedAt = &t
	}
	if s.lastErr != nil {
		e := s.lastErr.Error()
		st.LastError = &e
	}
	return st
}

// backlogCollector exports the shipping backlog at scrape time.
type backlogCollector struct {
	s         *shipper
	rows, age *prometheus.Desc
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.age
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.status()
	c.s.mu.Lock()
	n := c.s.backlog
	c.s.mu.Unlock()
	for k, name := range rowNames {
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(n[k]), name)
	}
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, st.BacklogAgeSeconds)
}
