package usage

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/statusapi"
)

// Defaults of Options.
const (
	DefaultQueueSize     = 50_000
	DefaultFlushInterval = 100 * time.Millisecond
	DefaultBatchSize     = 1000
	DefaultRetention     = 90 * 24 * time.Hour
	// activityReserve is room in the queue that only activity changes may
	// use: a flood of requests must not cost a pool's intervals.
	activityReserve = 1024
	// checkpointEvery is how often the open intervals' rows are brought up
	// to date, and retentionEvery how often old rows are pruned.
	checkpointEvery = time.Second
	retentionEvery  = time.Hour
)

// Options configures a Ledger. Zero values mean the defaults above; a nil
// Logger discards; a nil Registerer registers no metrics; a nil GPUModel
// leaves the intervals' GPU model empty; an empty Postgres ships nothing.
type Options struct {
	Path       string // the SQLite database file, created with its directory
	Host       string // this host's name, in shipped rows
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// QueueSize bounds the rows waiting for the writer; a request row that
	// finds it full is dropped and counted, never waited for.
	QueueSize int
	// FlushInterval and BatchSize: the writer commits what waits every
	// FlushInterval, or as soon as BatchSize rows wait, BatchSize rows at
	// most per transaction.
	FlushInterval time.Duration
	BatchSize     int
	// Retention is how long rows are kept; older ones are pruned unless
	// they wait to be shipped.
	Retention time.Duration
	// GPUModel names the model of the given GPUs (from NVML).
	GPUModel func(gpus []int) string
	// Postgres is the DSN of the fleet's PostgreSQL (postgres.go).
	Postgres string
	// ShipTimeout bounds the last shipping attempt at Close (default 10 s).
	ShipTimeout time.Duration
}

// Ledger records requests and pool activity in the local database. Its
// Request and PoolActivity methods never block on storage: they queue the
// row for the writer goroutine, which Open starts and Close ends. It
// implements proxy.Usage and pool.ActivityObserver.
type Ledger struct {
	opts Options
	log  *slog.Logger
	db   *sql.DB // one connection: the writer, the shipper's marks, retention
	id   string  // the ledger's identity, random, kept in its meta table
	m    *ledgerMetrics
	ship *shipper // nil without Postgres
	kick chan struct{}
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the writer has ended
	// closed makes Close run once; closeErr is what it returned.
	closed   sync.Once
	closeErr error

	mu      sync.Mutex // guards queue and the counts below
	queue   []event    // rows waiting for the writer, in order
	written [2]uint64  // rows committed, by kind
	dropped [2]uint64  // rows lost (queue full, failed commit), by kind
	lastErr error      // the last failed commit; nil after a good one

	// Owned by the writer goroutine.
	spare      []event                  // the last batch's array, reused
	open       map[string]*openInterval // each pool's current interval
	insReq     *sql.Stmt                // one request row
	insReqs    *sql.Stmt                // rowsPerInsert request rows
	args       []any                    // insReqs' arguments, reused
	checkpoint time.Time
	pruned     time.Time
}

// The two kinds of rows, for counts and metric labels.
const (
	kindRequest = iota
	kindInterval
)

// kindNames label the ledger's counts: request rows, and pool activity
// changes (which become interval rows); rowNames label the shipper's.
var (
	kindNames = [2]string{"request", "activity"}
	rowNames  = [2]string{"request", "interval"}
)

// event is one queued record: a finished request (rec set) or a pool's
// activity change (change set), and when.
type event struct {
	rec    *metrics.Record
	change *change
	at     time.Time // the request's end, or the change's moment
}

// change is a pool's activity change.
type change struct {
	pool     string
	gpus     []int
	activity pool.Activity
	profile  string
}

// openInterval is a pool's current interval, held by the writer. seq is its
// row once a checkpoint wrote it; 0 before.
type openInterval struct {
	seq      int64
	pool     string
	activity pool.Activity
	profile  string
	gpus     []int
	gpuModel string
	start    time.Time
}

// Open opens (creating and migrating) the ledger at opts.Path, closes the
// intervals a crashed predecessor left open at their last checkpoint, and
// starts the writer (and, with Postgres, the shipper). Close ends them.
func Open(ctx context.Context, opts Options) (*Ledger, error) {
	opts.QueueSize = cmp.Or(opts.QueueSize, DefaultQueueSize)
	opts.FlushInterval = cmp.Or(opts.FlushInterval, DefaultFlushInterval)
	opts.BatchSize = cmp.Or(opts.BatchSize, DefaultBatchSize)
	opts.Retention = cmp.Or(opts.Retention, DefaultRetention)
	opts.ShipTimeout = cmp.Or(opts.ShipTimeout, 10*time.Second)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(opts.Path), 0o750); err != nil {
		return nil, fmt.Errorf("usage ledger: %w", err)
	}
	db, err := openSQLite(opts.Path, false)
	if err != nil {
		return nil, err
	}
	l := &Ledger{opts: opts, log: opts.Logger.With("component", "usage"), db: db,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		open: make(map[string]*openInterval)}
	if err := l.init(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage ledger %s: %w", opts.Path, err)
	}
	l.m = newLedgerMetrics(opts.Registerer, l)
	if opts.Postgres != "" {
		l.ship = newShipper(l, opts.Postgres)
	}
	go l.run()
	if l.ship != nil {
		go l.ship.run()
	}
	return l, nil
}

// openSQLite opens the database at path in WAL mode. A reader opens it
// read-only and never creates it.
func openSQLite(path string, reader bool) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	if reader {
		q.Add("mode", "ro")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("usage ledger: %w", err)
		}
	} else {
		q.Add("_pragma", "journal_mode(WAL)")
		// In WAL mode NORMAL loses no committed transaction when the
		// process dies, only (possibly) the last ones at a power cut.
		q.Add("_pragma", "synchronous(NORMAL)")
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("usage ledger %s: %w", path, err)
	}
	if !reader {
		db.SetMaxOpenConns(1) // one writer; SQLite takes one at a time anyway
	}
	return db, nil
}

// init migrates the schema, reads or makes the ledger's id, closes leftover
// open intervals and prepares the writer's statement.
func (l *Ledger) init(ctx context.Context) error {
	if err := migrateSQLite(ctx, l.db); err != nil {
		return err
	}
	err := l.db.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'ledger'`).Scan(&l.id)
	if errors.Is(err, sql.ErrNoRows) {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		l.id = hex.EncodeToString(b)
		_, err = l.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('ledger', ?)`, l.id)
	}
	if err != nil {
		return fmt.Errorf("ledger id: %w", err)
	}
	res, err := l.db.ExecContext(ctx, `UPDATE intervals SET is_open = 0 WHERE is_open = 1`)
	if err != nil {
		return fmt.Errorf("closing intervals left open: %w", err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		l.log.Warn("closed pool intervals left open by a previous run at their last checkpoint", "intervals", n)
	}
	if l.insReq, err = l.db.PrepareContext(ctx, insertRequests(1)); err != nil {
		return err
	}
	l.insReqs, err = l.db.PrepareContext(ctx, insertRequests(rowsPerInsert))
	return err
}

// rowsPerInsert is how many request rows one INSERT statement carries: a
// statement per row would cost the writer several times the CPU.
const rowsPerInsert = 64

// requestColumns is the number of values of a request row.
const requestColumns = 17

// insertRequests is the INSERT of n request rows.
func insertRequests(n int) string {
	row := "(" + strings.Repeat("?, ", requestColumns-1) + "?)"
	return `INSERT INTO requests (request_id, arrived_us, ended_us, tenant, model, profile, pool, status, outcome, stream,
		prompt_tokens, completion_tokens, tokens_estimated, queue_wait_us, ttft_us, duration_us, caused_swap) VALUES ` +
		strings.Repeat(row+", ", n-1) + row
}

// ID is the ledger's identity: with the host name, it keys shipped rows.
func (l *Ledger) ID() string { return l.id }

// Request queues a finished request's row. It implements proxy.Usage: it
// never blocks; when the queue is full the row is dropped and counted.
func (l *Ledger) Request(rec *metrics.Record) {
	l.enqueue(event{rec: rec, at: time.Now()}, l.opts.QueueSize)
}

// PoolActivity queues a pool's activity change. It implements
// pool.ActivityObserver; changes may use a reserve of the queue that
// requests may not.
func (l *Ledger) PoolActivity(poolName string, gpus []int, a pool.Activity, profile string, at time.Time) {
	l.enqueue(event{change: &change{pool: poolName, gpus: gpus, activity: a, profile: profile}, at: at}, l.opts.QueueSize+activityReserve)
}

func (l *Ledger) enqueue(ev event, limit int) {
	kind := kindRequest
	if ev.rec == nil {
		kind = kindInterval
	}
	l.mu.Lock()
	if len(l.queue) >= limit {
		l.dropped[kind]++
		l.mu.Unlock()
		l.m.dropped[kind].Inc()
		return
	}
	l.queue = append(l.queue, ev)
	full := len(l.queue) == l.opts.BatchSize
	l.mu.Unlock()
	if full {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Close writes every queued row, closes the open intervals, makes a last
// bounded attempt to ship what is unshipped, and closes the database. Call
// it once nothing calls Request or PoolActivity any more.
func (l *Ledger) Close() error {
	l.closed.Do(func() {
		close(l.stop)
		<-l.done
		if l.ship != nil {
			l.ship.close()
		}
		l.closeErr = l.db.Close()
	})
	return l.closeErr
}

// run is the writer: it commits what waits every FlushInterval or as soon
// as a batch is full, until Close, when it writes the rest.
func (l *Ledger) run() {
	defer close(l.done)
	tick := time.NewTicker(l.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			l.flush()
			l.closeOpen(time.Now())
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.flush()
	}
}

// flush writes everything queued, BatchSize rows per transaction, then
// brings the open intervals' rows up to date once a second and prunes old
// rows once an hour.
func (l *Ledger) flush() {
	l.mu.Lock()
	all := l.queue
	l.queue, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	for b := all; len(b) > 0; {
		n := min(len(b), l.opts.BatchSize)
		l.write(b[:n])
		b = b[n:]
	}
	clear(all) // let the records go
	l.spare = all[:0]
	now := time.Now()
	if now.Sub(l.checkpoint) >= checkpointEvery {
		l.checkpoint = now
		l.commit("checkpoint", func(tx *sql.Tx) error { return l.checkpointOpen(tx, now) })
	}
	if now.Sub(l.pruned) >= retentionEvery {
		l.pruned = now
		l.prune(now)
	}
	if l.ship != nil {
		l.ship.wake()
	}
}

// write commits one batch of rows in one transaction.
func (l *Ledger) write(batch []event) {
	var n [2]uint64
	for _, ev := range batch {
		if ev.rec != nil {
			n[kindRequest]++
		} else {
			n[kindInterval]++
		}
	}
	ok := l.commit("write", func(tx *sql.Tx) error {
		one, many := tx.Stmt(l.insReq), tx.Stmt(l.insReqs)
		// Runs of request rows go rowsPerInsert at a time; an activity
		// change between them is applied in its place, so that rows keep
		// their order.
		for i := 0; i < len(batch); {
			if batch[i].rec == nil {
				if err := l.applyActivity(tx, batch[i].change, batch[i].at); err != nil {
					return err
				}
				i++
				continue
			}
			j := i
			for j < len(batch) && j-i < rowsPerInsert && batch[j].rec != nil {
				j++
			}
			stmt := many
			if j-i < rowsPerInsert {
				stmt, j = one, i+1
			}
			l.args = l.args[:0]
			for k := i; k < j; k++ {
				l.args = appendRequest(l.args, batch[k].rec, batch[k].at)
			}
			if _, err := stmt.Exec(l.args...); err != nil {
				return err
			}
			i = j
		}
		clear(l.args)
		return nil
	})
	l.mu.Lock()
	for k := range n {
		if ok {
			l.written[k] += n[k]
		} else {
			l.dropped[k] += n[k]
		}
	}
	l.mu.Unlock()
	for k := range n {
		if ok {
			l.m.written[k].Add(float64(n[k]))
		} else {
			l.m.dropped[k].Add(float64(n[k]))
		}
	}
}

// commit runs f in a transaction and commits it; a failure is logged,
// counted and kept for /status, and reported as false.
func (l *Ledger) commit(what string, f func(tx *sql.Tx) error) bool {
	tx, err := l.db.Begin()
	if err == nil {
		if err = f(tx); err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
	}
	l.mu.Lock()
	l.lastErr = err
	l.mu.Unlock()
	if err != nil {
		l.m.errors.Inc()
		l.log.Error("usage ledger: "+what+" failed", "err", err)
		return false
	}
	return true
}

// appendRequest appends the values of r's row, which ended at end.
func appendRequest(args []any, r *metrics.Record, end time.Time) []any {
	return append(args, r.RequestID, end.Add(-r.Duration).UnixMicro(), end.UnixMicro(), r.Client, r.Model, r.Profile, r.Pool,
		r.Status, cmp.Or(r.Outcome, metrics.OutcomeCompleted), r.Stream, r.PromptTokens, r.CompletionTokens, r.TokensEstimated,
		r.QueueWait.Microseconds(), r.TTFB.Microseconds(), r.Duration.Microseconds(), r.CausedSwap)
}

// applyActivity ends the pool's current interval at the change and begins
// the next (none after ActivityNone). An interval that never reached a
// checkpoint is written whole when it ends; one of zero length is dropped.
func (l *Ledger) applyActivity(tx *sql.Tx, c *change, at time.Time) error {
	cur := l.open[c.pool]
	if cur != nil && cur.activity == c.activity && cur.profile == c.profile {
		return nil
	}
	if cur != nil {
		if err := l.endInterval(tx, cur, at); err != nil {
			return err
		}
		delete(l.open, c.pool)
	}
	if c.activity == pool.ActivityNone {
		return nil
	}
	model := ""
	if l.opts.GPUModel != nil {
		model = l.opts.GPUModel(c.gpus)
	}
	l.open[c.pool] = &openInterval{pool: c.pool, activity: c.activity, profile: c.profile, gpus: c.gpus, gpuModel: model, start: at}
	return nil
}

// endInterval writes cur's row with its end.
func (l *Ledger) endInterval(tx *sql.Tx, cur *openInterval, end time.Time) error {
	switch {
	case cur.seq != 0:
		_, err := tx.Exec(`UPDATE intervals SET end_us = ?, is_open = 0 WHERE seq = ?`, end.UnixMicro(), cur.seq)
		return err
	case !end.After(cur.start):
		return nil
	}
	_, err := l.insertInterval(tx, cur, end, false)
	return err
}

func (l *Ledger) insertInterval(tx *sql.Tx, iv *openInterval, end time.Time, open bool) (int64, error) {
	res, err := tx.Exec(`INSERT INTO intervals (pool, activity, profile, gpus, gpu_model, start_us, end_us, is_open)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, iv.pool, string(iv.activity), iv.profile, formatGPUs(iv.gpus), iv.gpuModel,
		iv.start.UnixMicro(), end.UnixMicro(), open)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// checkpointOpen writes each open interval's row, with now as its end so
// far: a report sees the time up to now, and a crash loses at most a
// second of it.
func (l *Ledger) checkpointOpen(tx *sql.Tx, now time.Time) error {
	for _, iv := range l.open {
		if iv.seq != 0 {
			if _, err := tx.Exec(`UPDATE intervals SET end_us = ? WHERE seq = ?`, now.UnixMicro(), iv.seq); err != nil {
				return err
			}
			continue
		}
		end := now
		if end.Before(iv.start) {
			end = iv.start
		}
		seq, err := l.insertInterval(tx, iv, end, true)
		if err != nil {
			return err
		}
		iv.seq = seq
	}
	return nil
}

// closeOpen ends every open interval at now (at Close: the pools have
// reported their end already, unless something still ran).
func (l *Ledger) closeOpen(now time.Time) {
	if len(l.open) == 0 {
		return
	}
	l.commit("closing intervals", func(tx *sql.Tx) error {
		for name, iv := range l.open {
			if err := l.endInterval(tx, iv, now); err != nil {
				return err
			}
			delete(l.open, name)
		}
		return nil
	})
}

// prune deletes rows that ended before the retention, except those that
// wait to be shipped.
func (l *Ledger) prune(now time.Time) {
	cut := now.Add(-l.opts.Retention).UnixMicro()
	keepUnshipped := l.ship != nil
	var n [2]int64
	l.commit("pruning", func(tx *sql.Tx) error {
		for k, q := range [2]string{
			`DELETE FROM requests WHERE ended_us < ? AND (shipped = 1 OR NOT ?)`,
			`DELETE FROM intervals WHERE end_us < ? AND is_open = 0 AND (shipped = 1 OR NOT ?)`,
		} {
			res, err := tx.Exec(q, cut, keepUnshipped)
			if err != nil {
				return err
			}
			n[k], _ = res.RowsAffected()
		}
		return nil
	})
	if n[0]+n[1] > 0 {
		l.log.Info("pruned usage rows past the retention", "requests", n[0], "intervals", n[1], "retention", l.opts.Retention)
	}
}

// formatGPUs renders a GPU list as the ledger stores it: "0,1".
func formatGPUs(gpus []int) string {
	var b strings.Builder
	for i, g := range gpus {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(g))
	}
	return b.String()
}

// parseGPUs reads formatGPUs' form back.
func parseGPUs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	gpus := make([]int, len(parts))
	for i, p := range parts {
		g, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("GPU list %q: %w", s, err)
		}
		gpus[i] = g
	}
	return gpus, nil
}

// Status is the ledger's part of GET /status.
func (l *Ledger) Status() *statusapi.Usage {
	l.mu.Lock()
	st := &statusapi.Usage{
		Path:    l.opts.Path,
		Queued:  len(l.queue),
		Written: l.written[kindRequest] + l.written[kindInterval],
		Dropped: l.dropped[kindRequest] + l.dropped[kindInterval],
	}
	if l.lastErr != nil {
		s := l.lastErr.Error()
		st.LastError = &s
	}
	l.mu.Unlock()
	if l.ship != nil {
		st.Shipping = l.ship.status()
	}
	return st
}

// queued is the number of rows waiting for the writer.
func (l *Ledger) queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// ledgerMetrics are the ledger's collectors.
type ledgerMetrics struct {
	written, dropped [2]prometheus.Counter
	errors           prometheus.Counter
}

func newLedgerMetrics(reg prometheus.Registerer, l *Ledger) *ledgerMetrics {
	written := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poold_usage_records_written_total", Help: "Usage ledger records committed to the local database, by kind (request: a request's row; activity: a pool's activity change).",
	}, []string{"kind"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "poold_usage_records_dropped_total", Help: "Usage ledger records lost, by kind (request, activity): the writer's queue was full, or their commit failed.",
	}, []string{"kind"})
	m := &ledgerMetrics{errors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "poold_usage_write_errors_total", Help: "Usage ledger transactions that failed.",
	})}
	for k, name := range kindNames {
		m.written[k], m.dropped[k] = written.WithLabelValues(name), dropped.WithLabelValues(name)
	}
	if reg != nil {
		reg.MustRegister(written, dropped, m.errors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "poold_usage_queue_records", Help: "Usage ledger records waiting for the writer.",
		}, func() float64 { return float64(l.queued()) }))
	}
	return m
}
