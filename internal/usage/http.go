package usage

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/poold/poold/internal/openai"
)

// Window is a report's time range and shape, from flags or a query string.
type Window struct {
	Since, Until time.Time
	By           By
	Format       string
	Split        Split
	Spread       Spread
}

// Query is a report's parameters as given, each "" for its default.
type Query struct {
	Since, Until, By, Format, Split, Spread string
}

// ParseTime reads a report's --since or --until: RFC 3339, a date
// (2006-01-02, midnight UTC), a date and time (2006-01-02T15:04, UTC),
// "now", or a Go duration meaning that long before now ("24h").
func ParseTime(s string, now time.Time) (time.Time, error) {
	if s == "now" {
		return now, nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly, "2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time: use RFC 3339, 2006-01-02, 2006-01-02T15:04, now, or a duration before now such as 24h", s)
}

// ParseWindow reads a report's query: since and until as ParseTime reads
// them (by default, the 24 hours up to now), by (default tenant), format
// (default table), split and spread (default the prices', else tokens and
// none).
func ParseWindow(q Query, prices *Prices, now time.Time) (Window, error) {
	var w Window
	var errs []error
	var err error
	if w.Until, err = ParseTime(orDefault(q.Until, "now"), now); err != nil {
		errs = append(errs, fmt.Errorf("until: %w", err))
	}
	if q.Since == "" {
		w.Since = w.Until.Add(-24 * time.Hour)
	} else if w.Since, err = ParseTime(q.Since, now); err != nil {
		errs = append(errs, fmt.Errorf("since: %w", err))
	}
	if err == nil && !w.Since.Before(w.Until) {
		errs = append(errs, errors.New("since must be before until"))
	}
	if w.By, err = ParseBy(orDefault(q.By, string(ByTenant))); err != nil {
		errs = append(errs, err)
	}
	w.Format = orDefault(q.Format, FormatTable)
	if err := CheckFormat(w.Format); err != nil {
		errs = append(errs, err)
	}
	if w.Split, err = ParseSplit(orDefault(q.Split, orDefault(prices.Split, string(SplitTokens)))); err != nil {
		errs = append(errs, err)
	}
	if w.Spread, err = ParseSpread(orDefault(q.Spread, prices.Spread)); err != nil {
		errs = append(errs, err)
	}
	return w, errors.Join(errs...)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Handler serves GET /usage?since=&until=&by=&format=&split=&spread=&tenant= from
// the ledger at path (JSON unless format says otherwise); a tenant
// restricts the report to that tenant's lines (Usage.OfTenant). It reads
// no credentials: poold binds it behind the admin token and tenants' keys,
// which decide who may ask for what.
func Handler(path string, prices Prices) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		win, err := ParseWindow(Query{Since: q.Get("since"), Until: q.Get("until"), By: q.Get("by"), Format: orDefault(q.Get("format"), FormatJSON),
			Split: q.Get("split"), Spread: q.Get("spread")}, &prices, time.Now())
		if err != nil {
			openai.WriteError(w, r, http.StatusBadRequest, "invalid_usage_query", "", err.Error())
			return
		}
		src, err := OpenReader(r.Context(), path)
		if err != nil {
			openai.WriteError(w, r, http.StatusServiceUnavailable, "usage_unavailable", "", err.Error())
			return
		}
		defer src.Close()
		u, err := Collect(r.Context(), src, win.Since, win.Until, win.Split)
		if err != nil {
			openai.WriteError(w, r, http.StatusInternalServerError, "usage_unavailable", "", err.Error())
			return
		}
		u.SpreadPoolTime(win.Spread)
		if t := q.Get("tenant"); t != "" {
			u = u.OfTenant(t)
		}
		switch win.Format {
		case FormatJSON:
			w.Header().Set("Content-Type", "application/json")
		case FormatCSV:
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		_ = u.Report(win.By, &prices).Write(w, win.Format)
	})
}
