package usage

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/poold/poold/internal/activity"
	"github.com/poold/poold/internal/pgtest"
)

// pgRows lists what PostgreSQL holds, one string per row, sorted.
func pgRows(t *testing.T, dsn string) (reqs, ivs []string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT host, ledger, seq, request_id, tenant, prompt_tokens, completion_tokens, ended_at FROM poold_usage_requests`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var host, ledger, id, tenant string
		var seq, p, c int64
		var end time.Time
		if err := rows.Scan(&host, &ledger, &seq, &id, &tenant, &p, &c, &end); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, fmt.Sprintf("%s/%s/%d %s %s %d %d %d", host, ledger, seq, id, tenant, p, c, end.UnixMicro()))
	}
	rows, err = conn.Query(ctx, `SELECT host, ledger, seq, pool, activity, profile, gpus, started_at, ended_at FROM poold_usage_intervals`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var host, ledger, pl, act, prof string
		var seq int64
		var gpus []int32
		var start, end time.Time
		if err := rows.Scan(&host, &ledger, &seq, &pl, &act, &prof, &gpus, &start, &end); err != nil {
			t.Fatal(err)
		}
		ivs = append(ivs, fmt.Sprintf("%s/%s/%d %s %s %s %v %d %d", host, ledger, seq, pl, act, prof, gpus, start.UnixMicro(), end.UnixMicro()))
	}
	slices.Sort(reqs)
	slices.Sort(ivs)
	return reqs, ivs
}

// localRows lists the ledger's rows as pgRows does.
func localRows(t *testing.T, path, host, ledger string) (reqs, ivs []string) {
	t.Helper()
	rs, is := readAll(t, path)
	for _, r := range rs {
		reqs = append(reqs, fmt.Sprintf("%s/%s/%d %s %s %d %d %d", host, ledger, r.Seq, r.RequestID, r.Tenant, r.PromptTokens, r.CompletionTokens, r.Ended.UnixMicro()))
	}
	for _, iv := range is {
		ivs = append(ivs, fmt.Sprintf("%s/%s/%d %s %s %s %v %d %d", host, ledger, iv.Seq, iv.Pool, iv.Activity, iv.Profile, iv.GPUs, iv.Start.UnixMicro(), iv.End.UnixMicro()))
	}
	slices.Sort(reqs)
	slices.Sort(ivs)
	return reqs, ivs
}

func waitShipped(t *testing.T, l *Ledger, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := l.Status()
		if st.Queued == 0 && st.Shipping.BacklogRows == 0 && st.Shipping.LastError == nil && st.Shipping.LastShippedAt != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not shipped within 60 s: %+v %+v", what, st, st.Shipping)
		}
		l.ship.wake()
		time.Sleep(20 * time.Millisecond)
	}
}

func TestShippingSurvivesAnOutageAndNeverDuplicates(t *testing.T) {
	pg := pgtest.Start(t)
	path := filepath.Join(t.TempDir(), "usage.db")
	l := openLedger(t, Options{Path: path, Host: "h1", Postgres: pg.DSN(), FlushInterval: 20 * time.Millisecond})
	now := time.Now()
	l.PoolActivity("p", []int{0, 1}, activity.Idle, "m", now)
	for i := range 1500 {
		l.Request(requestRecord(i, "a"))
	}
	l.PoolActivity("p", []int{0, 1}, activity.Serving, "m", now.Add(time.Millisecond))
	waitShipped(t, l, "before the outage")

	pg.Stop()
	for i := 1500; i < 3000; i++ {
		l.Request(requestRecord(i, "b"))
	}
	l.PoolActivity("p", []int{0, 1}, activity.Idle, "m", now.Add(2*time.Millisecond))
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := l.Status().Shipping
		if st.LastError != nil && st.BacklogRows >= 1500 && st.BacklogAgeSeconds > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the outage does not show: %+v", st)
		}
		l.ship.wake()
		time.Sleep(20 * time.Millisecond)
	}
	pg.Start()
	waitShipped(t, l, "after the outage")

	// A crash between PostgreSQL's commit and the local mark: the rows are
	// shipped again, and PostgreSQL keeps one of each.
	if _, err := l.store().db.Exec(`UPDATE requests SET shipped = 0 WHERE seq > 1000`); err != nil {
		t.Fatal(err)
	}
	l.ship.wake()
	waitShipped(t, l, "again")
	l.PoolActivity("p", []int{0, 1}, activity.None, "", now.Add(3*time.Millisecond))
	if err := l.Close(); err != nil { // the last intervals ship at Close
		t.Fatal(err)
	}

	wantReqs, wantIvs := localRows(t, path, "h1", l.ID())
	gotReqs, gotIvs := pgRows(t, pg.DSN())
	if len(wantReqs) != 3000 || len(wantIvs) != 3 {
		t.Fatalf("the ledger holds %d requests and %d intervals, want 3000 and 3", len(wantReqs), len(wantIvs))
	}
	if !slices.Equal(gotReqs, wantReqs) {
		t.Errorf("PostgreSQL holds %d request rows, the ledger %d, and they differ", len(gotReqs), len(wantReqs))
	}
	if !slices.Equal(gotIvs, wantIvs) {
		t.Errorf("PostgreSQL intervals:\n%q\nledger:\n%q", gotIvs, wantIvs)
	}

	// The fleet report reads PostgreSQL.
	src, err := OpenPostgres(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	u, err := Collect(context.Background(), src, now.Add(-time.Minute), now.Add(time.Minute), SplitTokens)
	if err != nil {
		t.Fatal(err)
	}
	rep := u.Report(ByPool, &Prices{})
	if rep.Total.Requests != 3000 || len(rep.Pools) != 1 || rep.Pools[0].Pool != "h1/p" || !rep.AddsUp() || rep.Pools[0].GPUSeconds != 0.006 {
		t.Errorf("fleet report: total %+v, pools %+v", rep.Total, rep.Pools)
	}
}

func TestMigratePostgres(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for range 2 { // idempotent
		if err := MigratePostgres(ctx, conn); err != nil {
			t.Fatal(err)
		}
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT version FROM poold_usage_schema`).Scan(&v); err != nil || v != len(postgresMigrations) {
		t.Errorf("version %d (%v), want %d", v, err, len(postgresMigrations))
	}
	if _, err := conn.Exec(ctx, `UPDATE poold_usage_schema SET version = 99`); err != nil {
		t.Fatal(err)
	}
	if err := MigratePostgres(ctx, conn); err == nil {
		t.Error("a newer schema was accepted")
	}
}
