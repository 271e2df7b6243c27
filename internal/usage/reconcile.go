package usage

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// LogLine is the part of an access-log line that reconciliation reads.
type LogLine struct {
	Time             time.Time `json:"time"`
	Msg              string    `json:"msg"`
	Component        string    `json:"component"`
	RequestID        string    `json:"request_id"`
	Client           string    `json:"client"`
	PromptTokens     int64     `json:"prompt_tokens"`
	CompletionTokens int64     `json:"completion_tokens"`
}

// ReadAccessLog reads the request lines of a JSON access log; other lines
// (a daemon log sharing the stream, say) are skipped.
func ReadAccessLog(r io.Reader) ([]LogLine, error) {
	var out []LogLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l LogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "request" || l.Component != "access" || l.RequestID == "" {
			continue
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the access log: %w", err)
	}
	return out, nil
}

// TenantTotals are one tenant's requests and tokens on each side.
type TenantTotals struct {
	Tenant                          string
	LogRequests, LedgerRequests     int64
	LogPrompt, LedgerPrompt         int64
	LogCompletion, LedgerCompletion int64
}

// Equal reports whether both sides agree.
func (t TenantTotals) Equal() bool {
	return t.LogRequests == t.LedgerRequests && t.LogPrompt == t.LedgerPrompt && t.LogCompletion == t.LedgerCompletion
}

// Reconciliation compares an access log with the ledger over a window.
type Reconciliation struct {
	Since, Until time.Time
	Tenants      []TenantTotals
	// Differences lists each request on one side only, or whose tenant or
	// tokens differ.
	Differences []string
}

// OK reports whether the two sides agree exactly.
func (rc *Reconciliation) OK() bool { return len(rc.Differences) == 0 }

// reconcileMargin widens the window in which rows are read for matching,
// so that a request near an edge, whose log line and row times differ by
// microseconds, is matched and judged by one time.
const reconcileMargin = time.Minute

// Reconcile matches the access log's request lines with the ledger's rows
// by request id (the k-th line of an id with its k-th row, in order), and
// totals requests and tokens per tenant over [since, until), judging a
// matched pair by the row's end and anything else by its own time.
func Reconcile(ctx context.Context, src Source, lines []LogLine, since, until time.Time) (*Reconciliation, error) {
	rows, err := src.Requests(ctx, since.Add(-reconcileMargin), until.Add(reconcileMargin))
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	in := func(t time.Time) bool { return !t.Before(since) && t.Before(until) }
	byID := make(map[string][]*Request)
	for i := range rows {
		byID[rows[i].RequestID] = append(byID[rows[i].RequestID], &rows[i])
	}
	totals := make(map[string]*TenantTotals)
	tenant := func(name string) *TenantTotals {
		t := totals[name]
		if t == nil {
			t = &TenantTotals{Tenant: name}
			totals[name] = t
		}
		return t
	}
	rc := &Reconciliation{Since: since, Until: until}
	matched := make(map[*Request]bool)
	for _, l := range lines {
		var row *Request
		if q := byID[l.RequestID]; len(q) > 0 {
			row, byID[l.RequestID] = q[0], q[1:]
			matched[row] = true
		}
		at := l.Time
		if row != nil {
			at = row.Ended
		}
		if !in(at) {
			continue
		}
		t := tenant(l.Client)
		t.LogRequests++
		t.LogPrompt += l.PromptTokens
		t.LogCompletion += l.CompletionTokens
		switch {
		case row == nil:
			rc.Differences = append(rc.Differences, fmt.Sprintf("request %s (%s, %s): in the access log, not in the ledger", l.RequestID, l.Client, l.Time.Format(time.RFC3339Nano)))
			continue
		case row.Tenant != l.Client || row.PromptTokens != l.PromptTokens || row.CompletionTokens != l.CompletionTokens:
			rc.Differences = append(rc.Differences, fmt.Sprintf("request %s: access log %s %d+%d tokens, ledger %s %d+%d tokens",
				l.RequestID, l.Client, l.PromptTokens, l.CompletionTokens, row.Tenant, row.PromptTokens, row.CompletionTokens))
		}
		t = tenant(row.Tenant)
		t.LedgerRequests++
		t.LedgerPrompt += row.PromptTokens
		t.LedgerCompletion += row.CompletionTokens
	}
	for i := range rows {
		row := &rows[i]
		if matched[row] || !in(row.Ended) {
			continue
		}
		t := tenant(row.Tenant)
		t.LedgerRequests++
		t.LedgerPrompt += row.PromptTokens
		t.LedgerCompletion += row.CompletionTokens
		rc.Differences = append(rc.Differences, fmt.Sprintf("request %s (%s, %s): in the ledger, not in the access log", row.RequestID, row.Tenant, row.Ended.Format(time.RFC3339Nano)))
	}
	for _, t := range totals {
		rc.Tenants = append(rc.Tenants, *t)
	}
	slices.SortFunc(rc.Tenants, func(a, b TenantTotals) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return rc, nil
}

// maxListed bounds the differences a reconciliation prints.
const maxListed = 50

// Write prints the reconciliation: a table of tenants, then the differences.
func (rc *Reconciliation) Write(w io.Writer) error {
	fmt.Fprintf(w, "reconcile %s .. %s: access log against the usage ledger\n\n", rc.Since.Format(time.RFC3339), rc.Until.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TENANT\tREQUESTS LOG\tLEDGER\tPROMPT LOG\tLEDGER\tCOMPLETION LOG\tLEDGER\t\t")
	for _, t := range rc.Tenants {
		mark := "equal"
		if !t.Equal() {
			mark = "DIFFERENT"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", dash(t.Tenant), t.LogRequests, t.LedgerRequests,
			t.LogPrompt, t.LedgerPrompt, t.LogCompletion, t.LedgerCompletion, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rc.OK() {
		fmt.Fprintln(w, "\nno difference")
		return nil
	}
	fmt.Fprintf(w, "\n%d differences:\n", len(rc.Differences))
	for i, d := range rc.Differences {
		if i == maxListed {
			fmt.Fprintf(w, "  … and %d more\n", len(rc.Differences)-maxListed)
			break
		}
		fmt.Fprintln(w, "  "+d)
	}
	return nil
}
