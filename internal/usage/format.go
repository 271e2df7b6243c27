package usage

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats of a report.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatCSV   = "csv"
)

// CheckFormat reports an unknown --format.
func CheckFormat(f string) error {
	switch f {
	case FormatTable, FormatJSON, FormatCSV:
		return nil
	}
	return fmt.Errorf("format %q: must be table, json or csv", f)
}

// Write renders r in format.
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case FormatCSV:
		return r.writeCSV(w)
	}
	return r.writeTable(w)
}

// columns are a report's columns after the key: the tenant of a serving
// line only where the key is not the tenant, and the shared GPU time only
// with a spread.
func (r *Report) columns() []string {
	cols := []string{string(r.By), "use", "tenant", "requests", "failed", "prompt_tokens", "completion_tokens",
		"estimated_requests", "gpu_seconds", "shared_gpu_seconds", "gpu_cost", "token_cost", "cost"}
	return r.pick(cols)
}

// cells renders row in the order of columns.
func (r *Report) cells(row Row) []string {
	return r.pick([]string{row.Key, row.Use, row.Tenant, itoa(row.Requests), itoa(row.Failed), itoa(row.PromptTokens),
		itoa(row.CompletionTokens), itoa(row.EstimatedRequests), micros(row.GPUMicros), micros(row.SharedMicros),
		money(row.GPUCost), money(row.TokenCost), money(row.Cost)})
}

// pick leaves out of a full row of columns the tenant with --by tenant and
// the shared GPU time without a spread.
func (r *Report) pick(c []string) []string {
	if r.Spread == SpreadNone {
		c = slices.Delete(c, 9, 10)
	}
	if r.By == ByTenant {
		c = slices.Delete(c, 2, 3)
	}
	return c
}

// costColumns is how many columns at the end of a row are costs.
const costColumns = 3

func (r *Report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write(r.columns())
	for _, row := range append(r.Rows, r.Total) {
		_ = cw.Write(r.cells(row))
	}
	cw.Flush()
	return cw.Error()
}

func (r *Report) writeTable(w io.Writer) error {
	of := ""
	if r.Tenant != "" {
		of = " of tenant " + strconv.Quote(r.Tenant)
	}
	spread := ""
	if r.Spread != SpreadNone {
		spread = fmt.Sprintf("; the pools' own time spread over tenants by %s", r.Spread)
	}
	prices := "; no prices set"
	if r.Priced {
		prices = "; prices in " + r.Currency
	}
	fmt.Fprintf(w, "usage%s %s .. %s (%s), by %s; serving GPU time split by %s%s%s\n\n",
		of, r.Since.Format(time.RFC3339), r.Until.Format(time.RFC3339), r.Until.Sub(r.Since), r.By, r.Split, spread, prices)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	cols := r.columns()
	for i, c := range cols {
		cols[i] = strings.ToUpper(strings.ReplaceAll(c, "_", " "))
	}
	cols[len(cols)-1] += " (" + r.Currency + ")"
	if !r.Priced {
		cols = cols[:len(cols)-costColumns]
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	for _, row := range append(r.Rows, r.Total) {
		cells := r.cells(row)[:len(cols)]
		for i := range 3 {
			cells[i] = dash(cells[i])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !r.Priced {
		fmt.Fprintln(w, "\nno prices set, so no cost columns: set usage-cost in the settings file, or --usage-gpu-hour, --usage-prompt-per-million, --usage-completion-per-million (POOLD_USAGE_GPU_HOUR, …)")
	}
	if r.Tenant != "" {
		_, err := fmt.Fprintln(w, "\ncheck: none in the report of one tenant (its lines do not add up to a pool's time)")
		return err
	}
	fmt.Fprintln(w, "\ncheck: each pool's lines against the GPU time its intervals cover in the window")
	for _, p := range r.Pools {
		mark := "adds up"
		if !p.AddsUp {
			mark = "DOES NOT ADD UP"
		}
		fmt.Fprintf(w, "  %s: lines %.6f GPU-s = pool %.6f GPU-s: %s (covered %.3f s of the window's %.3f s)\n",
			p.Pool, p.LinesSeconds, p.GPUSeconds, mark, p.CoveredSeconds, p.WindowSeconds)
	}
	if len(r.Pools) == 0 {
		fmt.Fprintln(w, "  no pool interval in the window")
	}
	return nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// micros renders GPU-microseconds as seconds, exactly.
func micros(us int64) string { return strconv.FormatFloat(float64(us)/1e6, 'f', 6, 64) }

func money(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
