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

// ParseWindow reads a window: since and until as ParseTime reads them (by
// default, the 24 hours up to now), by (default tenant), format (default
// table) and split (default dflt, else tokens).
func ParseWindow(since, until, by, format, split string, dflt Split, now time.Time) (Window, error) {
	var w Window
	var errs []error
	var err error
	if until == "" {
		until = "now"
	}
	if w.Until, err = ParseTime(until, now); err != nil {
		errs = append(errs, fmt.Errorf("until: %w", err))
	}
	if since == "" {
		w.Since = w.Until.Add(-24 * time.Hour)
	} else if w.Since, err = ParseTime(since, now); err != nil {
		errs = append(errs, fmt.Errorf("since: %w", err))
	}
	if err == nil && !w.Since.Before(w.Until) {
		errs = append(errs, errors.New("since must be before until"))
	}
	if w.By, err = ParseBy(orDefault(by, string(ByTenant))); err != nil {
		errs = append(errs, err)
	}
	w.Format = orDefault(format, FormatTable)
	if err := CheckFormat(w.Format); err != nil {
		errs = append(errs, err)
	}
	if w.Split, err = ParseSplit(orDefault(split, orDefault(string(dflt), string(SplitTokens)))); err != nil {
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

// Handler serves GET /usage?since=&until=&by=&format=&split=&tenant= from
// the ledger at path (JSON unless format says otherwise); a tenant
// restricts the report to that tenant's lines (Usage.OfTenant). It reads
// no credentials: poold binds it behind the admin token and tenants' keys,
// which decide who may ask for what.
func Handler(path string, prices Prices) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		win, err := ParseWindow(q.Get("since"), q.Get("until"), q.Get("by"), orDefault(q.Get("format"), FormatJSON), q.Get("split"), Split(prices.Split), time.Now())
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
