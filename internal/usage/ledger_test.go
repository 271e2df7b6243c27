package usage

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/record"
)

func openLedger(t testing.TB, opts Options) *Ledger {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "state", "usage.db")
	}
	l, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func requestRecord(i int, tenant string) *record.Request {
	return &record.Request{RequestID: fmt.Sprintf("r%d", i), Pool: "p", Model: "alias", Profile: "m", Client: tenant, Status: 200,
		Stream: i%2 == 0, Counted: true, PromptTokens: i, CompletionTokens: 2 * i, QueueWait: time.Millisecond,
		TTFB: 2 * time.Millisecond, Duration: 3 * time.Millisecond, Outcome: record.OutcomeCompleted, CausedSwap: i == 0}
}

func readAll(t *testing.T, path string) ([]Request, []Interval) {
	t.Helper()
	src, err := OpenReader(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	far := time.Now().Add(time.Hour)
	reqs, err := src.Requests(context.Background(), time.Unix(0, 0), far)
	if err != nil {
		t.Fatal(err)
	}
	ivs, err := src.Intervals(context.Background(), time.Unix(0, 0), far)
	if err != nil {
		t.Fatal(err)
	}
	return reqs, ivs
}

func TestLedgerWritesRequestsAndIntervals(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := openLedger(t, Options{Registerer: reg, GPUModel: func(gpus []int) string { return fmt.Sprint("model of ", gpus) }})
	start := time.Now()
	gpus := []int{0, 1}
	l.PoolActivity("p", gpus, activity.Empty, "", start)
	l.PoolActivity("p", gpus, activity.Swapping, "m", start.Add(time.Second))
	l.PoolActivity("p", gpus, activity.Idle, "m", start.Add(2*time.Second))
	l.PoolActivity("p", gpus, activity.Idle, "m", start.Add(3*time.Second)) // no change
	l.PoolActivity("p", gpus, activity.Serving, "m", start.Add(4*time.Second))
	for i := range 2500 {
		l.Request(requestRecord(i, "team-"+string(rune('a'+i%3))))
	}
	l.PoolActivity("p", gpus, activity.Idle, "m", start.Add(5*time.Second))
	l.PoolActivity("p", gpus, activity.None, "", start.Add(6*time.Second))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	reqs, ivs := readAll(t, l.opts.Path)
	if len(reqs) != 2500 {
		t.Fatalf("%d request rows, want 2500", len(reqs))
	}
	r := reqs[7]
	if r.RequestID != "r7" || r.Tenant != "team-b" || r.PromptTokens != 7 || r.CompletionTokens != 14 || r.Outcome != "completed" ||
		r.QueueWait != time.Millisecond || r.TTFT != 2*time.Millisecond || r.Duration != 3*time.Millisecond || r.Ended.Sub(r.Arrived) != 3*time.Millisecond ||
		r.Pool != "p" || r.Profile != "m" || r.Model != "alias" || r.Stream || r.CausedSwap || !reqs[0].CausedSwap {
		t.Errorf("row 7: %+v", r)
	}
	var got []string
	for _, iv := range ivs {
		got = append(got, fmt.Sprintf("%s:%s %s..%s %v %s", iv.Activity, iv.Profile, iv.Start.Sub(start).Round(time.Millisecond), iv.End.Sub(start).Round(time.Millisecond), iv.GPUs, iv.GPUModel))
	}
	want := []string{"empty: 0s..1s [0 1] model of [0 1]", "swapping:m 1s..2s [0 1] model of [0 1]", "idle:m 2s..4s [0 1] model of [0 1]",
		"serving:m 4s..5s [0 1] model of [0 1]", "idle:m 5s..6s [0 1] model of [0 1]"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("intervals:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := testutil.ToFloat64(l.m.written[kindRequest]); n != 2500 {
		t.Errorf("written requests metric %v", n)
	}
	if st := l.Status(); st.Written != 2507 || st.Dropped != 0 || st.Queued != 0 || st.LastError != nil {
		t.Errorf("status %+v", st)
	}
}

func TestLedgerDropsWhenTheQueueIsFullAndNeverBlocks(t *testing.T) {
	// The writer never wakes before Close: the queue fills.
	l := openLedger(t, Options{QueueSize: 10, BatchSize: 1 << 30, FlushInterval: time.Hour})
	for i := range 15 {
		l.Request(requestRecord(i, "a"))
	}
	for i := range activityReserve + 5 {
		l.PoolActivity("p", nil, []activity.Activity{activity.Idle, activity.Serving}[i%2], "m", time.Now())
	}
	if n := testutil.ToFloat64(l.m.dropped[kindRequest]); n != 5 {
		t.Errorf("dropped requests %v, want 5", n)
	}
	// Activity changes may use the reserve: 10 + 1024 records in all.
	if n := testutil.ToFloat64(l.m.dropped[kindInterval]); n != 5 {
		t.Errorf("dropped activity changes %v, want 5", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if reqs, _ := readAll(t, l.opts.Path); len(reqs) != 10 {
		t.Errorf("%d rows after Close, want the 10 queued", len(reqs))
	}
}

func TestLedgerCommitsWithinTheFlushInterval(t *testing.T) {
	l := openLedger(t, Options{FlushInterval: 20 * time.Millisecond})
	l.Request(requestRecord(1, "a"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if reqs, _ := readAll(t, l.opts.Path); len(reqs) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the row was not committed while poold runs")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLedgerCheckpointsOpenIntervalsAndClosesThemAfterACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path, FlushInterval: 10 * time.Millisecond})
	start := time.Now()
	l.PoolActivity("p", []int{0}, activity.Idle, "m", start)
	// A report made while poold runs sees the open interval up to about now.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ivs := readAll(t, path)
		if len(ivs) == 1 && ivs[0].Open && ivs[0].End.After(start) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint of the open interval: %+v", ivs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A crash: the writer stops without closing anything. (The test stops
	// it by hand; the database stays as a killed process leaves it.)
	close(l.stop)
	<-l.done
	l.closed.Do(func() { l.cur.close() })
	l2 := openLedger(t, Options{Path: path})
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	_, ivs := readAll(t, path)
	if len(ivs) != 1 || ivs[0].Open || !ivs[0].End.After(start) {
		t.Errorf("after a restart: %+v, want the interval closed at its checkpoint", ivs)
	}
}

func TestLedgerMigrations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path})
	id := l.ID()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopening changes nothing and keeps the ledger's identity.
	l = openLedger(t, Options{Path: path})
	if l.ID() != id {
		t.Errorf("ledger id %q after reopening, was %q", l.ID(), id)
	}
	l.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != len(sqliteMigrations) {
		t.Errorf("schema version %d (%v), want %d", v, err, len(sqliteMigrations))
	}
	// A database from a newer poold is refused, by the writer and readers.
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, len(sqliteMigrations)+1)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(context.Background(), Options{Path: path}); err == nil || !strings.Contains(err.Error(), "newer than this poold") {
		t.Errorf("Open of a newer schema: %v", err)
	}
	if _, err := OpenReader(context.Background(), path); err == nil {
		t.Error("OpenReader of a newer schema succeeded")
	}
	if _, err := OpenReader(context.Background(), filepath.Join(t.TempDir(), "none.db")); err == nil {
		t.Error("OpenReader of a missing ledger succeeded")
	}
}

func TestLedgerPrunesPastTheRetention(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path})
	l.Request(requestRecord(1, "a"))
	l.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-100 * 24 * time.Hour)
	if _, err := db.Exec(`INSERT INTO requests (request_id, arrived_us, ended_us, tenant, model, profile, pool, status, outcome, stream,
		prompt_tokens, completion_tokens, tokens_estimated, queue_wait_us, ttft_us, duration_us, caused_swap)
		VALUES ('old', ?, ?, 'a', 'm', 'm', 'p', 200, 'completed', 0, 1, 1, 0, 0, 0, 0, 0)`, old.UnixMicro(), old.UnixMicro()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	// Unshipped rows stay while a PostgreSQL is configured (here, one that
	// never answers); without one they go.
	l = openLedger(t, Options{Path: path, Postgres: "postgres://poold@127.0.0.1:1/none?connect_timeout=1", ShipTimeout: 100 * time.Millisecond})
	l.Close()
	if reqs, _ := readAll(t, path); len(reqs) != 2 {
		t.Fatalf("%d rows kept while shipping, want 2", len(reqs))
	}
	l = openLedger(t, Options{Path: path})
	l.Close()
	if reqs, _ := readAll(t, path); len(reqs) != 1 || reqs[0].RequestID != "r1" {
		t.Errorf("after pruning: %+v", reqs)
	}
}

func TestHandlerServesReports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path})
	now := time.Now()
	l.PoolActivity("p", []int{0}, activity.Serving, "m", now.Add(-time.Minute))
	l.Request(requestRecord(1, "a"))
	l.Request(requestRecord(2, "b"))
	l.PoolActivity("p", []int{0}, activity.Idle, "m", now)
	l.PoolActivity("p", []int{0}, activity.None, "", now.Add(time.Second))
	l.Close()
	h := Handler(path, Prices{GPUHour: 1})
	for _, c := range []struct {
		query, want, absent string
		code                int
	}{
		{"?since=1h", `"key": "a"`, "", 200},
		{"?since=1h&format=csv&by=pool", "pool,use,tenant,requests", "", 200},
		{"?since=1h&format=table", "adds up", "", 200},
		{"?since=yesterday", "is not a time", "", 400},
		{"?by=color", "must be tenant, model, pool or day", "", 400},
		// One tenant's report: its lines only, no other tenant's, no
		// pool's own time, no pool check.
		{"?since=1h&tenant=a", `"tenant": "a"`, `"key": "b"`, 200},
		{"?since=1h&tenant=a", `"key": "a"`, `"use": "idle"`, 200},
		{"?since=1h&tenant=a", `"pools": null`, `"addsUp"`, 200},
		{"?since=1h&tenant=a&format=csv&by=model", "m,serving,a,1,", ",b,", 200},
		{"?since=1h&tenant=a&format=table", `usage of tenant "a"`, "adds up", 200},
		// Spread, the pool's idle second is on the tenants' lines; a tenant's
		// own report carries its share.
		{"?since=1h&spread=tokens", `"sharedGpuMicroseconds"`, `"use": "idle"`, 200},
		{"?since=1h&spread=holder&tenant=a", `"sharedGpuMicroseconds"`, `"key": "b"`, 200},
		{"?spread=everyone", "must be none, tokens or holder", "", 400},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/usage"+c.query, nil))
		body := rec.Body.String()
		if rec.Code != c.code || !strings.Contains(body, c.want) || c.absent != "" && strings.Contains(body, c.absent) {
			t.Errorf("GET /usage%s: %d %s; want %d with %q, without %q", c.query, rec.Code, body, c.code, c.want, c.absent)
		}
	}
}
