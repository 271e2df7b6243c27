package usage

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/statusapi"
)

// Defaults of Options.
const (
	DefaultQueueSize     = 50_000
	DefaultFlushInterval = 100 * time.Millisecond
	DefaultBatchSize     = 1000
	DefaultRetention     = 90 * 24 * time.Hour
	DefaultSpoolSize     = 50_000
	DefaultSpoolBytes    = 64 << 20
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
	// SpoolSize bounds the rows the database did not take that wait in
	// memory (when the spool file cannot take them either), and
	// SpoolBytes the spool file beside the database (recover.go); a row
	// past both is dropped and counted.
	SpoolSize  int
	SpoolBytes int64
	// GPUModel names the model of the given GPUs (from NVML).
	GPUModel func(gpus []int) string
	// Postgres is the DSN of the fleet's PostgreSQL (postgres.go).
	Postgres string
	// ShipTimeout bounds the last shipping attempt at Close (default 10 s).
	ShipTimeout time.Duration
}

// Ledger records requests and pool activity in the local database. Its
// Request and PoolActivity methods never block on storage: they queue the
// row for the writer goroutine, which Open starts and Close ends. Rows the
// database does not take wait in the spool until it does (recover.go). It
// implements proxy.Usage and activity.Observer.
type Ledger struct {
	opts  Options
	log   *slog.Logger
	runID string // this run's identity, in the rows it spools
	m     *ledgerMetrics
	ship  *shipper // nil without Postgres
	kick  chan struct{}
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when the writer has ended
	// closed makes Close run once; closeErr is what it returned.
	closed   sync.Once
	closeErr error

	mu        sync.Mutex // guards cur, queue and the state below
	cur       *store     // the open database; nil while none could be opened
	queue     []event    // rows waiting for the writer, in order
	written   [2]uint64  // rows committed, by kind
	dropped   [2]uint64  // rows lost (queue or spool full), by kind
	lastErr   error      // the last failed commit; nil after a good one
	stalled   error      // why rows wait in the spool; nil while they are written
	spooled   int        // rows in the spool, in memory and in its file
	droppedAt time.Time  // when a row was last dropped; zero when never

	// errLog and dropLog bound the ERROR lines of a lasting failure.
	errLog, dropLog rate.Sometimes

	// Owned by the writer goroutine.
	spare      []event              // the last batch's array, reused
	rows       []row                // the flush's rows, reused
	held       []row                // rows waiting in memory, oldest first (recover.go)
	spool      *spool               // the spool file
	spoolN     uint64               // the number of this run's last spooled row
	retryAt    time.Time            // after a failure, when to try again; zero when none
	lastFile   os.FileInfo          // the last database file opened
	open       map[string]*interval // each pool's current interval
	args       []any                // insReqs' arguments, reused
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
	rec    *record.Request
	change *change
	at     time.Time // the request's end, or the change's moment
}

// change is a pool's activity change.
type change struct {
	pool     string
	gpus     []int
	activity activity.Activity
	profile  string
}

// Open opens (creating and migrating) the ledger at opts.Path, moving a
// corrupt one aside, closes the intervals a crashed predecessor left open
// at their last checkpoint, and starts the writer (and, with Postgres, the
// shipper), which first writes what a predecessor left in the spool. Close
// ends them.
func Open(ctx context.Context, opts Options) (*Ledger, error) {
	opts.QueueSize = cmp.Or(opts.QueueSize, DefaultQueueSize)
	opts.FlushInterval = cmp.Or(opts.FlushInterval, DefaultFlushInterval)
	opts.BatchSize = cmp.Or(opts.BatchSize, DefaultBatchSize)
	opts.Retention = cmp.Or(opts.Retention, DefaultRetention)
	opts.SpoolSize = cmp.Or(opts.SpoolSize, DefaultSpoolSize)
	opts.SpoolBytes = cmp.Or(opts.SpoolBytes, DefaultSpoolBytes)
	opts.ShipTimeout = cmp.Or(opts.ShipTimeout, 10*time.Second)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(opts.Path), 0o750); err != nil {
		return nil, fmt.Errorf("usage ledger: %w", err)
	}
	log := opts.Logger.With("component", "usage")
	sp, err := openSpool(opts.Path+".spool", opts.SpoolBytes)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, opts.Path, true, log)
	if err != nil {
		return nil, err
	}
	l := &Ledger{opts: opts, log: log, runID: randomID(), cur: st, spool: sp, spooled: sp.rows,
		errLog: rate.Sometimes{Interval: 10 * time.Second}, dropLog: rate.Sometimes{Interval: 10 * time.Second},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		open: make(map[string]*interval)}
	l.lastFile, _ = st.file.Stat()
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

// ID is the identity of the ledger in the open database: with the host
// name, it keys shipped rows. It is "" while no database is open.
func (l *Ledger) ID() string {
	if st := l.store(); st != nil {
		return st.id
	}
	return ""
}

// store is the open database; nil while none could be opened.
func (l *Ledger) store() *store {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

// Request queues a finished request's row. It implements proxy.Usage: it
// never blocks; when the queue is full the row is dropped and counted.
func (l *Ledger) Request(rec *record.Request) {
	l.enqueue(event{rec: rec, at: time.Now()}, l.opts.QueueSize)
}

// PoolActivity queues a pool's activity change. It implements
// activity.Observer; changes may use a reserve of the queue that
// requests may not.
func (l *Ledger) PoolActivity(poolName string, gpus []int, a activity.Activity, profile string, at time.Time) {
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
		l.droppedAt = time.Now()
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
		if st := l.store(); st != nil {
			l.closeErr = st.db.Close()
			_ = st.file.Close()
		}
	})
	return l.closeErr
}

// run is the writer: it commits what waits every FlushInterval or as soon
// as a batch is full, until Close, when it writes the rest: to the
// database, else to the spool file, else it is lost, and counted.
func (l *Ledger) run() {
	defer close(l.done)
	tick := time.NewTicker(l.opts.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			l.retryAt = time.Time{} // one last attempt, whatever the backoff
			l.flush()
			l.closeOpen(time.Now())
			l.abandon()
			return
		case <-tick.C:
		case <-l.kick:
		}
		l.flush()
	}
}

// flush turns what is queued into rows and saves them, then brings the
// open intervals' rows up to date once a second and prunes old rows once
// an hour.
func (l *Ledger) flush() {
	l.mu.Lock()
	all := l.queue
	l.queue, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	rows := l.rows[:0]
	var changes uint64 // activity changes that end no interval: nothing to write
	for _, ev := range all {
		switch {
		case ev.rec != nil:
			rows = append(rows, row{Request: ev.rec, End: ev.at})
		default:
			if iv := l.applyActivity(ev.change, ev.at); iv != nil {
				rows = append(rows, row{Interval: iv})
			} else {
				changes++
			}
		}
	}
	clear(all) // let the records go
	l.spare = all[:0]
	l.count(kindInterval, changes)
	now := time.Now()
	retrying := !l.retryAt.IsZero()
	ok := l.save(rows, now)
	clear(rows)
	l.rows = rows[:0]
	// A retry that found nothing to write tries the checkpoint instead.
	if ok && (retrying || now.Sub(l.checkpoint) >= checkpointEvery) {
		l.checkpoint = now
		l.checkpointOpen(now)
	}
	if ok && now.Sub(l.pruned) >= retentionEvery {
		l.pruned = now
		l.prune(now)
	}
	if l.ship != nil {
		l.ship.wake()
	}
}

// write commits one batch of rows in one transaction: nil, a *fileFault
// when the batch went to a file the path no longer names (found after the
// commit, or by SQLite), or the commit's error.
func (l *Ledger) write(batch []row) error {
	st := l.cur
	marks := st.marks
	spooled := slices.ContainsFunc(batch, func(r row) bool { return r.Run != "" })
	if spooled {
		marks = maps.Clone(st.marks)
	}
	var n [2]uint64
	err := l.commit(st, "write", func(tx *sql.Tx) error {
		one, many := tx.Stmt(st.insReq), tx.Stmt(st.insReqs)
		for i := 0; i < len(batch); {
			r := &batch[i]
			if r.Run != "" {
				if r.N <= marks[r.Run] {
					i++ // spooled, and written already
					continue
				}
				marks[r.Run] = r.N
			}
			if r.Interval != nil {
				if err := l.endInterval(tx, st, r.Interval); err != nil {
					return err
				}
				n[kindInterval]++
				i++
				continue
			}
			// Runs of request rows go rowsPerInsert at a time (spooled
			// ones one by one, for their marks); an interval between them
			// is written in its place, so that rows keep their order.
			j := i + 1
			for j < len(batch) && j-i < rowsPerInsert && batch[j].Request != nil && batch[j].Run == "" {
				j++
			}
			stmt := many
			if j-i < rowsPerInsert {
				stmt, j = one, i+1
			}
			l.args = l.args[:0]
			for k := i; k < j; k++ {
				l.args = appendRequest(l.args, batch[k].Request, batch[k].End)
			}
			if _, err := stmt.Exec(l.args...); err != nil {
				return err
			}
			n[kindRequest] += uint64(j - i)
			i = j
		}
		clear(l.args)
		if spooled {
			return writeMarks(tx, marks, st.marks)
		}
		return nil
	})
	if err == nil {
		if f := st.fault(l.opts.Path); f != nil {
			return f
		}
	} else if isCorrupt(err) {
		return &fileFault{kind: faultCorrupt, why: err.Error()}
	}
	if err != nil {
		return err
	}
	st.marks = marks
	l.count(kindRequest, n[kindRequest])
	l.count(kindInterval, n[kindInterval])
	return nil
}

// count adds n rows of the kind written.
func (l *Ledger) count(kind int, n uint64) {
	if n == 0 {
		return
	}
	l.mu.Lock()
	l.written[kind] += n
	l.mu.Unlock()
	l.m.written[kind].Add(float64(n))
}

// commit runs f in a transaction on st and commits it; a failure is
// logged, counted and kept for /status, and returned.
func (l *Ledger) commit(st *store, what string, f func(tx *sql.Tx) error) error {
	tx, err := st.db.Begin()
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
		l.errLog.Do(func() { l.log.Error("usage ledger: "+what+" failed", "err", err) })
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// appendRequest appends the values of r's row, which ended at end.
func appendRequest(args []any, r *record.Request, end time.Time) []any {
	return append(args, r.RequestID, end.Add(-r.Duration).UnixMicro(), end.UnixMicro(), r.Client, r.Model, r.Profile, r.Pool,
		r.Status, cmp.Or(r.Outcome, record.OutcomeCompleted), r.Stream, r.PromptTokens, r.CompletionTokens, r.TokensEstimated,
		r.QueueWait.Microseconds(), r.TTFB.Microseconds(), r.Duration.Microseconds(), r.CausedSwap)
}

// prune deletes rows that ended before the retention, except those that
// wait to be shipped.
func (l *Ledger) prune(now time.Time) {
	cut := now.Add(-l.opts.Retention).UnixMicro()
	keepUnshipped := l.ship != nil
	var n [2]int64
	_ = l.commit(l.cur, "pruning", func(tx *sql.Tx) error {
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
		Spooled: l.spooled,
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
