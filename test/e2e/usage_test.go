package e2e

// The usage ledger (docs/usage.md): reconciliation with the access log, the
// cost report, durability under SIGKILL and SIGTERM, shipping to PostgreSQL
// through an outage.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/poold/poold/internal/pgtest"
)

// tenants are the tenants of the usage tests; each one's key is "sk-" and
// its name (usageTenants).
var tenants = []string{"team-a", "team-b", "team-c"}

// usageTenants is the tenants file of tenants, each with the requests per
// minute rpm gives it (none where it gives none).
func usageTenants(rpm map[string]int) []byte {
	var specs []tenantSpec
	for _, name := range tenants {
		specs = append(specs, tenantSpec{Name: name, Key: "sk-" + name, RPM: rpm[name]})
	}
	return tenantsJSON(specs...)
}

const usageSettings = `
usage-cost:
  currency: USD
  gpu-hour: 2.0
  pools:
    - {name: p1, gpu-hour: 3.0}
  prompt-per-million: 0.5
  completion-per-million: 1.5
`

// usageProfiles: profiles a, b and c on two pools (p1 has two GPUs) with a
// short residency and small queues, so that shifting demand swaps and
// bursts overflow the queues; x, on p1 only, crashes mid-stream after 30
// tokens in all, so its streams are cut.
func usageProfiles(tag string) []byte {
	extra := map[string]any{"minResidency": "300ms", "maxQueue": 10, "maxQueueWait": "30s"}
	fast := func(id string, pools []string, flags ...string) sim {
		return sim{ID: id, Pools: pools, Flags: append([]string{"--sim-itl", "1ms", "--sim-load-delay", "50ms"}, flags...)}
	}
	return profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: extra}, {Name: "p1", GPUs: []int{1, 2}, Default: "b", Extra: extra}},
		[]sim{fast("a", nil), fast("b", nil), fast("c", nil), fast("x", []string{"p1"}, "--sim-crash-after-tokens", "30")}, nil)
}

// sent is what the clients saw: for each response they read to its end (or
// were refused with), its request id and when.
type sent struct {
	mu       sync.Mutex // guards the fields below
	finished map[string]time.Time
	kinds    map[string]int
}

func newSent() *sent { return &sent{finished: map[string]time.Time{}, kinds: map[string]int{}} }

func (s *sent) add(kind, id string, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kinds[kind]++
	if done && id != "" {
		s.finished[id] = time.Now()
	}
}

// usageRequest sends one request of the given kind for tenant and model:
// "plain", "stream" (read whole), "abandon" (a stream the client leaves
// after its first event) or "crash" (a stream on x, which its engine may
// break off).
func usageRequest(ctx context.Context, client *http.Client, base, kind, tenant, model string, tokens int, s *sent) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody(model, kind != "plain", tokens)))
	req.Header.Set("Authorization", "Bearer sk-"+tenant)
	resp, err := client.Do(req)
	if err != nil {
		s.add(kind+": transport error", "", false)
		return
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	if kind == "abandon" && resp.StatusCode == http.StatusOK {
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil || strings.HasPrefix(line, "data: ") {
				break
			}
		}
		cancel()
		s.add(kind, id, false)
		return
	}
	_, err = io.Copy(io.Discard, resp.Body)
	s.add(kind+" "+strconv.Itoa(resp.StatusCode), id, err == nil)
	if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests {
		// A clear refusal: back off as a client would.
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// runUsageLoad sends n requests (until ctx ends when n is 0) from clients
// closed-loop clients: tenants and kinds at random, and a favourite model
// that changes every 700 ms so that the pools swap.
func runUsageLoad(ctx context.Context, base string, clients, n int, kinds []string, s *sent) {
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var left atomic.Int64
	left.Store(int64(n))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 21))
			for ctx.Err() == nil && (n == 0 || left.Add(-1) >= 0) {
				kind := kinds[rng.IntN(len(kinds))]
				model := string(rune('a' + (int(time.Since(start)/(700*time.Millisecond))+rng.IntN(2))%3))
				if kind == "crash" {
					model = "x"
				}
				usageRequest(ctx, client, base, kind, tenants[rng.IntN(len(tenants))], model, 4+rng.IntN(8), s)
			}
		})
	}
	wg.Wait()
}

// ledgerRow is one request row of a ledger or of PostgreSQL.
type ledgerRow struct {
	Seq                   int64
	ID, Tenant, Outcome   string
	Status                int
	Prompt, Completion    int64
	Estimated, CausedSwap bool
	EndedUs               int64
}

func (r ledgerRow) String() string {
	return fmt.Sprintf("%d %s %s %s %d %d %d %v %v %d", r.Seq, r.ID, r.Tenant, r.Outcome, r.Status, r.Prompt, r.Completion, r.Estimated, r.CausedSwap, r.EndedUs)
}

// readLedger reads every request row and interval of the ledger at path.
func readLedger(t *testing.T, path string) (rows []ledgerRow, intervals []string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Query(`SELECT seq, request_id, tenant, outcome, status, prompt_tokens, completion_tokens, tokens_estimated, caused_swap, ended_us FROM requests ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for rs.Next() {
		var r ledgerRow
		if err := rs.Scan(&r.Seq, &r.ID, &r.Tenant, &r.Outcome, &r.Status, &r.Prompt, &r.Completion, &r.Estimated, &r.CausedSwap, &r.EndedUs); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	is, err := db.Query(`SELECT seq, pool, activity, profile, gpus, start_us, end_us FROM intervals ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	for is.Next() {
		var seq, start, end int64
		var pl, act, prof, gpus string
		if err := is.Scan(&seq, &pl, &act, &prof, &gpus, &start, &end); err != nil {
			t.Fatal(err)
		}
		intervals = append(intervals, fmt.Sprintf("%d %s %s %s {%s} %d %d", seq, pl, act, prof, gpus, start, end))
	}
	return rows, intervals
}

// runPoold runs a poold subcommand and returns its output and exit code.
func runPoold(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(pooldBin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// usageReport is the part of `poold usage --format json` the tests read.
type usageReport struct {
	Rows []struct {
		Key, Use                                         string
		Requests, PromptTokens, CompletionTokens, Failed int64
		GPUMicros                                        int64 `json:"gpuMicroseconds"`
		SharedMicros                                     int64 `json:"sharedGpuMicroseconds"`
	}
	Total struct {
		GPUMicros int64 `json:"gpuMicroseconds"`
	}
	Pools []struct {
		Pool                                                    string
		WindowSeconds, CoveredSeconds, GPUSeconds, LinesSeconds float64
		AddsUp                                                  bool
	}
}

func TestUsageLedgerReconcilesWithTheAccessLog(t *testing.T) {
	const requests = 2000
	tag := t.Name()
	settings := writeSettings(t, usageSettings)
	state := filepath.Join(t.TempDir(), "state")
	begin := time.Now()
	d := startPoold(t, tag, usageProfiles(tag), "--config", settings, "--tenants", writeTenants(t, usageTenants(map[string]int{"team-c": 300})), "--state-dir", state, "--log-level", "warn",
		"--restart-backoff", "50ms", "--restart-backoff-max", "500ms")
	s := newSent()
	loadBegin := time.Now()
	runUsageLoad(context.Background(), d.url, 24, requests, []string{"plain", "plain", "plain", "stream", "stream", "stream", "abandon", "crash"}, s)
	loadEnd := time.Now()
	d.stop()
	end := time.Now()
	if d.err != nil {
		t.Fatalf("poold exited with %v", d.err)
	}
	t.Logf("clients saw: %v", s.kinds)

	logPath := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(logPath, []byte(d.stdout.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	type sums struct{ requests, prompt, completion int64 }
	logSums := map[string]*sums{}
	lines := 0
	for line := range strings.Lines(d.stdout.String()) {
		var l struct {
			Msg, Client string
			P           int64 `json:"prompt_tokens"`
			C           int64 `json:"completion_tokens"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "request" {
			continue
		}
		lines++
		if logSums[l.Client] == nil {
			logSums[l.Client] = &sums{}
		}
		logSums[l.Client].requests++
		logSums[l.Client].prompt += l.P
		logSums[l.Client].completion += l.C
	}
	rows, _ := readLedger(t, filepath.Join(state, "usage.db"))
	if lines != requests || len(rows) != requests {
		t.Fatalf("%d access-log lines and %d ledger rows, want %d of each", lines, len(rows), requests)
	}

	// Every outcome the load was built to produce is in the ledger: 503s
	// (a full queue, a restart backoff) and team-c's 429s (its requests
	// per minute) among them.
	outcomes := map[string]int{}
	estimated, swaps := 0, 0
	for _, r := range rows {
		outcomes[r.Outcome]++
		switch r.Status {
		case http.StatusServiceUnavailable:
			outcomes["503"]++
		case http.StatusTooManyRequests:
			outcomes["429"]++
		}
		if r.Estimated {
			estimated++
		}
		if r.CausedSwap {
			swaps++
		}
	}
	t.Logf("ledger outcomes %v; %d with estimated tokens; %d caused a swap", outcomes, estimated, swaps)
	for _, o := range []string{"completed", "upstream_aborted", "client_aborted", "503", "429"} {
		if outcomes[o] == 0 {
			t.Errorf("no request with outcome %q: %v", o, outcomes)
		}
	}
	if estimated == 0 || swaps == 0 {
		t.Errorf("estimated %d, caused a swap %d: want some of each", estimated, swaps)
	}

	// The ledger's tokens per tenant equal the access log's, exactly.
	out, code := runPoold(t, "usage", "reconcile", "--state-dir", state, "--access-log", logPath)
	t.Logf("poold usage reconcile:\n%s", out)
	if code != 0 || !strings.Contains(out, "no difference") {
		t.Errorf("reconcile exited %d", code)
	}
	// The run: the clients' load, from its first request to its last answer.
	rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	out, code = runPoold(t, "usage", "--state-dir", state, "--since", rfc(begin), "--until", rfc(end), "--by", "tenant", "--format", "json")
	var rep usageReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("poold usage --format json: exit %d, %v\n%s", code, err, out)
	}
	for _, r := range rep.Rows {
		if r.Use != "serving" {
			continue
		}
		want := logSums[r.Key]
		if want == nil || r.Requests != want.requests || r.PromptTokens != want.prompt || r.CompletionTokens != want.completion {
			t.Errorf("tenant %q: ledger %d requests, %d+%d tokens; access log %+v", r.Key, r.Requests, r.PromptTokens, r.CompletionTokens, want)
		}
		delete(logSums, r.Key)
	}
	if len(logSums) > 0 {
		t.Errorf("tenants in the access log, not in the report: %v", logSums)
	}

	// Each pool's intervals cover the run's wall time, within a second.
	out, code = runPoold(t, "usage", "--state-dir", state, "--since", rfc(loadBegin), "--until", rfc(loadEnd), "--format", "json")
	var run usageReport
	if err := json.Unmarshal([]byte(out), &run); err != nil || code != 0 {
		t.Fatalf("poold usage --format json: exit %d, %v\n%s", code, err, out)
	}
	wall := loadEnd.Sub(loadBegin).Seconds()
	if len(run.Pools) != 2 {
		t.Fatalf("pools in the report: %+v", run.Pools)
	}
	for _, p := range run.Pools {
		t.Logf("pool %s: intervals cover %.3f s of the run's %.3f s; %.3f GPU-s, lines %.3f", p.Pool, p.CoveredSeconds, wall, p.GPUSeconds, p.LinesSeconds)
		if p.CoveredSeconds < wall-1 || p.CoveredSeconds > wall || !p.AddsUp {
			t.Errorf("pool %s: covered %.3f s of %.3f s, adds up %v", p.Pool, p.CoveredSeconds, wall, p.AddsUp)
		}
	}

	// The cost report: tenants, the pools' own time, and the check.
	out, code = runPoold(t, "usage", "--config", settings, "--state-dir", state, "--since", rfc(begin), "--until", rfc(end), "--by", "pool")
	t.Logf("poold usage --by pool:\n%s", out)
	if code != 0 {
		t.Errorf("poold usage exited %d", code)
	}
	for _, want := range append(slices.Clone(tenants), "idle", "swapping", "empty", "COST (USD)", "p0: lines", "p1: lines") {
		if !strings.Contains(out, want) {
			t.Errorf("the cost report has no %q", want)
		}
	}
	if n := strings.Count(out, ": adds up"); n != 2 {
		t.Errorf("%d pools add up, want 2", n)
	}

	// Spread by tokens, the pools' own time is on the tenants' lines: one
	// line per tenant, the same GPU time in all, every pool adding up.
	out, code = runPoold(t, "usage", "--state-dir", state, "--since", rfc(begin), "--until", rfc(end), "--by", "tenant", "--spread", "tokens", "--format", "json")
	var spread usageReport
	if err := json.Unmarshal([]byte(out), &spread); err != nil || code != 0 {
		t.Fatalf("poold usage --spread tokens: exit %d, %v\n%s", code, err, out)
	}
	var shared int64
	for _, r := range spread.Rows {
		if r.Use != "serving" && r.Use != "unattributed" {
			t.Errorf("a line of the pools' own time left by the spread: %+v", r)
		}
		shared += r.SharedMicros
	}
	if spread.Total.GPUMicros != rep.Total.GPUMicros || shared == 0 {
		t.Errorf("spread: %d GPU-µs in all (%d shared), unspread %d", spread.Total.GPUMicros, shared, rep.Total.GPUMicros)
	}
	for _, p := range spread.Pools {
		if !p.AddsUp {
			t.Errorf("spread: pool %s does not add up: %+v", p.Pool, p)
		}
	}

	// Prices by flag alone, without the settings file; none at all: a hint.
	out, _ = runPoold(t, "usage", "--state-dir", state, "--since", rfc(begin), "--until", rfc(end), "--usage-gpu-hour", "2", "--usage-currency", "EUR")
	if !strings.Contains(out, "COST (EUR)") || !strings.Contains(out, "prices in EUR") {
		t.Errorf("priced by flag:\n%s", out)
	}
	out, _ = runPoold(t, "usage", "--state-dir", state, "--since", rfc(begin), "--until", rfc(end))
	if strings.Contains(out, "COST") || !strings.Contains(out, "no prices set, so no cost columns") {
		t.Errorf("without prices:\n%s", out)
	}
}

// lost lists the request ids the clients saw finish that the ledger lacks,
// and how long before the end the last of them finished.
func lost(s *sent, rows []ledgerRow, end time.Time) (ids []string, span time.Duration) {
	in := make(map[string]bool, len(rows))
	for _, r := range rows {
		in[r.ID] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, at := range s.finished {
		if !in[id] {
			ids = append(ids, id)
			span = max(span, end.Sub(at))
		}
	}
	return ids, span
}

func TestUsageLedgerDurability(t *testing.T) {
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	profs := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}}, []sim{{ID: "a"}}, nil)
	db := filepath.Join(state, "usage.db")

	// SIGKILL under load: at most one batch (1,000 rows, or 100 ms of
	// requests) is lost.
	d := startPoold(t, tag, profs, "--state-dir", state, "--access-log", os.DevNull, "--log-level", "warn")
	killed := newSent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runUsageLoad(ctx, d.url, 8, 0, []string{"plain"}, killed)
	}()
	waitFinished(t, killed, 2000)
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	<-d.exited
	cancel()
	<-done
	rows, _ := readLedger(t, db)
	ids, span := lost(killed, rows, at)
	t.Logf("SIGKILL: the clients saw %d requests finish; the ledger lost %d of them, the oldest finished %s before the kill",
		killed.count(), len(ids), span.Round(time.Millisecond))
	if len(ids) > 1000 {
		t.Errorf("SIGKILL lost %d rows, more than one batch", len(ids))
	}

	// SIGTERM under load, on the same state directory: nothing is lost.
	d = startPoold(t, tag, profs, "--state-dir", state, "--access-log", os.DevNull, "--log-level", "warn")
	termed := newSent()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	done = make(chan struct{})
	go func() {
		defer close(done)
		runUsageLoad(ctx, d.url, 8, 0, []string{"plain"}, termed)
	}()
	waitFinished(t, termed, 2000)
	d.stop()
	cancel()
	<-done
	rows, _ = readLedger(t, db)
	ids, _ = lost(termed, rows, time.Now())
	t.Logf("SIGTERM: the clients saw %d requests finish; the ledger lost %d", termed.count(), len(ids))
	if len(ids) > 0 {
		t.Errorf("SIGTERM lost %d rows: %v", len(ids), ids[:min(len(ids), 5)])
	}
}

// count is the number of requests the clients saw finish.
func (s *sent) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.finished)
}

// waitFinished waits until the clients saw n requests finish.
func waitFinished(t *testing.T, s *sent, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if got := s.count(); got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests finished in 2 minutes", s.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pgOutage is how long PostgreSQL is stopped mid-run: 30 s, or
// POOLD_E2E_PG_OUTAGE.
func pgOutage(t *testing.T) time.Duration {
	if v := os.Getenv("POOLD_E2E_PG_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("POOLD_E2E_PG_OUTAGE: %v", err)
		}
		return d
	}
	return 30 * time.Second
}

// usageStatus is the usage part of GET /status.
func (d *daemon) usageStatus() (queued, backlog int64, lastErr *string) {
	d.t.Helper()
	resp, err := http.Get(d.url + "/status")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Usage *struct {
			Queued   int64
			Shipping *struct {
				BacklogRows int64
				LastError   *string
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Usage == nil || st.Usage.Shipping == nil {
		d.t.Fatalf("/status has no usage shipping: %v", err)
	}
	return st.Usage.Queued, st.Usage.Shipping.BacklogRows, st.Usage.Shipping.LastError
}

func TestUsageShipsToPostgresThroughAnOutage(t *testing.T) {
	pg := pgtest.Start(t)
	tag := t.Name()
	state := filepath.Join(t.TempDir(), "state")
	profs := profilesJSON(tag, []pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "b"}},
		[]sim{{ID: "a", Flags: []string{"--sim-itl", "1ms"}}, {ID: "b", Flags: []string{"--sim-itl", "1ms"}}, {ID: "c", Flags: []string{"--sim-itl", "1ms"}}}, nil)
	d := startPoold(t, tag, profs, "--state-dir", state, "--access-log", os.DevNull, "--log-level", "warn", "--usage-postgres", pg.DSN())
	s := newSent()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runUsageLoad(ctx, d.url, 4, 0, []string{"plain", "stream"}, s)
	}()
	waitFinished(t, s, 300)

	pg.Stop()
	outage := time.NewTimer(pgOutage(t))
	deadline := time.Now().Add(time.Minute)
	for {
		if _, backlog, lastErr := d.usageStatus(); backlog > 0 && lastErr != nil {
			t.Logf("PostgreSQL down: backlog %d rows, %s", backlog, *lastErr)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/status shows no backlog nor error while PostgreSQL is down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	<-outage.C
	_, backlog, _ := d.usageStatus()
	pg.Start()
	t.Logf("PostgreSQL back after %s with %d rows waiting", pgOutage(t), backlog)
	waitFinished(t, s, s.count()+300)
	cancel()
	<-done
	deadline = time.Now().Add(2 * time.Minute)
	for {
		if queued, backlog, lastErr := d.usageStatus(); queued == 0 && backlog == 0 && lastErr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the backlog did not drain within 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.stop() // the last intervals ship at shutdown

	rows, ivs := readLedger(t, filepath.Join(state, "usage.db"))
	pgRows, pgIvs := readPostgres(t, pg.DSN())
	if len(rows) == 0 || len(ivs) == 0 {
		t.Fatalf("the ledger is empty: %d requests, %d intervals", len(rows), len(ivs))
	}
	for i, r := range rows { // no gap in the ledger itself
		if r.Seq != int64(i+1) {
			t.Fatalf("ledger row %d has seq %d", i, r.Seq)
		}
	}
	if !slices.Equal(rows, pgRows) {
		i := 0
		for i < min(len(rows), len(pgRows)) && rows[i] == pgRows[i] {
			i++
		}
		var ledger, pg any = "none", "none"
		if i < len(rows) {
			ledger = rows[i]
		}
		if i < len(pgRows) {
			pg = pgRows[i]
		}
		t.Errorf("PostgreSQL holds %d request rows, the ledger %d; the first difference: ledger %v, PostgreSQL %v", len(pgRows), len(rows), ledger, pg)
	}
	if !slices.Equal(ivs, pgIvs) {
		t.Errorf("PostgreSQL holds %d intervals, the ledger %d, and they differ", len(pgIvs), len(ivs))
	}
	t.Logf("PostgreSQL holds exactly the ledger's %d request rows and %d intervals", len(pgRows), len(pgIvs))
}

// readPostgres reads PostgreSQL's rows as readLedger reads the ledger's.
func readPostgres(t *testing.T, dsn string) (rows []ledgerRow, intervals []string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rs, err := conn.Query(ctx, `SELECT seq, request_id, tenant, outcome, status, prompt_tokens, completion_tokens, tokens_estimated, caused_swap, ended_at FROM poold_usage_requests ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var r ledgerRow
		var ended time.Time
		if err := rs.Scan(&r.Seq, &r.ID, &r.Tenant, &r.Outcome, &r.Status, &r.Prompt, &r.Completion, &r.Estimated, &r.CausedSwap, &ended); err != nil {
			t.Fatal(err)
		}
		r.EndedUs = ended.UnixMicro()
		rows = append(rows, r)
	}
	is, err := conn.Query(ctx, `SELECT seq, pool, activity, profile, array_to_string(gpus, ','), started_at, ended_at FROM poold_usage_intervals ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for is.Next() {
		var seq int64
		var pl, act, prof, gpus string
		var start, end time.Time
		if err := is.Scan(&seq, &pl, &act, &prof, &gpus, &start, &end); err != nil {
			t.Fatal(err)
		}
		intervals = append(intervals, fmt.Sprintf("%d %s %s %s {%s} %d %d", seq, pl, act, prof, gpus, start.UnixMicro(), end.UnixMicro()))
	}
	return rows, intervals
}
