package usage

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Prices are the settings file's usage-cost block (docs/usage.md). The zero
// value prices nothing: a report then shows usage without cost.
type Prices struct {
	Currency string `mapstructure:"currency"`
	// Split is how serving time is shared among tenants; "" means tokens.
	Split string `mapstructure:"split"`
	// Spread is how the pools' own time is shared among tenants (Spread);
	// "" means it is not: it stays on lines of its own.
	Spread string `mapstructure:"spread"`
	// GPUHour is the price of one GPU-hour where neither the pool nor its
	// GPUs' model has one of its own.
	GPUHour   float64      `mapstructure:"gpu-hour"`
	Pools     []NamedPrice `mapstructure:"pools"`
	GPUModels []NamedPrice `mapstructure:"gpu-models"`
	// Per million tokens, charged to the tenant whose requests used them.
	PromptPerMillion     float64 `mapstructure:"prompt-per-million"`
	CompletionPerMillion float64 `mapstructure:"completion-per-million"`
}

// NamedPrice is the price of one GPU-hour on a pool (its name, or
// "host/pool" for one host's pool in fleet reports) or on a GPU model (its
// name as NVML reports it).
type NamedPrice struct {
	Name    string  `mapstructure:"name"`
	GPUHour float64 `mapstructure:"gpu-hour"`
}

// Check validates the prices: no negative price, no name twice, a known split.
func (p *Prices) Check() error {
	var errs []error
	if p.Split != "" {
		if _, err := ParseSplit(p.Split); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := ParseSpread(p.Spread); err != nil {
		errs = append(errs, err)
	}
	for _, v := range []struct {
		name  string
		price float64
	}{{"gpu-hour", p.GPUHour}, {"prompt-per-million", p.PromptPerMillion}, {"completion-per-million", p.CompletionPerMillion}} {
		if v.price < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", v.name))
		}
	}
	for _, list := range []struct {
		name   string
		prices []NamedPrice
	}{{"pools", p.Pools}, {"gpu-models", p.GPUModels}} {
		seen := map[string]bool{}
		for i, np := range list.prices {
			switch {
			case np.Name == "":
				errs = append(errs, fmt.Errorf("%s[%d]: a name is required", list.name, i))
			case seen[np.Name]:
				errs = append(errs, fmt.Errorf("%s[%d]: %q is listed twice", list.name, i, np.Name))
			case np.GPUHour < 0:
				errs = append(errs, fmt.Errorf("%s[%d]: gpu-hour must not be negative", list.name, i))
			}
			seen[np.Name] = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("usage-cost: %w", err)
	}
	return nil
}

// Priced reports whether p sets any price: without one, a report has
// nothing to charge and leaves its cost columns out.
func (p *Prices) Priced() bool {
	if p.GPUHour > 0 || p.PromptPerMillion > 0 || p.CompletionPerMillion > 0 {
		return true
	}
	for _, np := range slices.Concat(p.Pools, p.GPUModels) {
		if np.GPUHour > 0 {
			return true
		}
	}
	return false
}

// gpuHour is the price of a GPU-hour on poolName (a pool key) with GPUs of
// model: the pool's own (by key, then by its name alone), else the model's,
// else the default.
func (p *Prices) gpuHour(poolName, model string) float64 {
	_, bare, _ := strings.Cut(poolName, "/")
	for _, name := range []string{poolName, bare} {
		if i := slices.IndexFunc(p.Pools, func(np NamedPrice) bool { return np.Name == name }); name != "" && i >= 0 {
			return p.Pools[i].GPUHour
		}
	}
	if i := slices.IndexFunc(p.GPUModels, func(np NamedPrice) bool { return np.Name == model }); model != "" && i >= 0 {
		return p.GPUModels[i].GPUHour
	}
	return p.GPUHour
}

// By is what a report's rows group by.
type By string

const (
	ByTenant By = "tenant"
	ByModel  By = "model"
	ByPool   By = "pool"
	ByDay    By = "day"
)

// ParseBy reads a --by value.
func ParseBy(s string) (By, error) {
	switch By(s) {
	case ByTenant, ByModel, ByPool, ByDay:
		return By(s), nil
	}
	return "", fmt.Errorf("by %q: must be tenant, model, pool or day", s)
}

// Row is one line of a report. Key is the tenant, model, pool or day it
// groups by; Use is UseServing for a tenant's use and a pool's activity
// (or UseUnattributed) otherwise; Tenant names the tenant of a serving line
// where the key is not the tenant.
type Row struct {
	Key    string `json:"key"`
	Use    string `json:"use"`
	Tenant string `json:"tenant,omitempty"`
	Counts
	GPUSeconds float64 `json:"gpuSeconds"`
	GPUCost    float64 `json:"gpuCost"`
	TokenCost  float64 `json:"tokenCost"`
	Cost       float64 `json:"cost"`
}

// Report is a window's usage grouped, priced and checked.
type Report struct {
	Since    time.Time `json:"since"`
	Until    time.Time `json:"until"`
	By       By        `json:"by"`
	Split    Split     `json:"split"`
	Spread   Spread    `json:"spread,omitempty"`
	Tenant   string    `json:"tenant,omitempty"` // the one tenant reported (Usage.OfTenant)
	Currency string    `json:"currency,omitempty"`
	// Priced is whether any price was set (Prices.Priced): without, every
	// cost is zero, and the table leaves its cost columns out.
	Priced bool        `json:"priced"`
	Rows   []Row       `json:"rows"`
	Total  Row         `json:"total"`
	Pools  []PoolCheck `json:"pools"`
}

// PoolCheck is a pool's add-up check in a report, in seconds.
type PoolCheck struct {
	Pool           string  `json:"pool"`
	WindowSeconds  float64 `json:"windowSeconds"`
	CoveredSeconds float64 `json:"coveredSeconds"`
	GPUSeconds     float64 `json:"gpuSeconds"`
	LinesSeconds   float64 `json:"linesSeconds"`
	AddsUp         bool    `json:"addsUp"`
}

// Report groups u by by and prices it.
func (u *Usage) Report(by By, prices *Prices) *Report {
	rep := &Report{Since: u.Since, Until: u.Until, By: by, Split: u.Split, Spread: u.Spread, Tenant: u.Tenant, Currency: prices.Currency, Priced: prices.Priced()}
	rows := make(map[[3]string]*Row)
	for _, a := range u.Atoms {
		k := [3]string{"", a.Use, a.Tenant}
		switch by {
		case ByTenant:
			k[0], k[2] = a.Tenant, ""
		case ByModel:
			k[0] = a.Profile
		case ByPool:
			k[0] = a.Pool
		case ByDay:
			k[0] = a.Day
		}
		r := rows[k]
		if r == nil {
			r = &Row{Key: k[0], Use: k[1], Tenant: k[2]}
			rows[k] = r
		}
		gpuCost := float64(a.GPUMicros) / 3.6e9 * prices.gpuHour(a.Pool, a.GPUModel)
		tokenCost := (float64(a.PromptTokens)*prices.PromptPerMillion + float64(a.CompletionTokens)*prices.CompletionPerMillion) / 1e6
		for _, r := range []*Row{r, &rep.Total} {
			r.add(a.Counts)
			r.GPUCost += gpuCost
			r.TokenCost += tokenCost
		}
	}
	for _, r := range rows {
		if r.Requests == 0 && r.GPUMicros == 0 {
			continue // a serving atom of a pool's time with no tenant left
		}
		rep.Rows = append(rep.Rows, *r)
	}
	rep.Total.Key, rep.Total.Use = "total", ""
	for _, r := range append([]*Row{&rep.Total}, rowPointers(rep.Rows)...) {
		r.GPUSeconds = float64(r.GPUMicros) / 1e6
		r.Cost = r.GPUCost + r.TokenCost
	}
	slices.SortFunc(rep.Rows, func(a, b Row) int {
		// The pools' own time after the tenants' within each key; with
		// --by tenant, after every tenant.
		ua, ub := slices.Index(useOrder, a.Use), slices.Index(useOrder, b.Use)
		if by == ByTenant && (a.Key == "") != (b.Key == "") {
			if a.Key == "" {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(ua, ub), cmp.Compare(a.Tenant, b.Tenant))
	})
	window := u.Until.Sub(u.Since).Seconds()
	for _, p := range u.Pools {
		rep.Pools = append(rep.Pools, PoolCheck{Pool: p.Pool, WindowSeconds: window, CoveredSeconds: float64(p.CoveredMicros) / 1e6,
			GPUSeconds: float64(p.GPUMicros) / 1e6, LinesSeconds: float64(p.LinesMicros) / 1e6, AddsUp: p.AddsUp()})
	}
	return rep
}

func rowPointers(rows []Row) []*Row {
	ps := make([]*Row, len(rows))
	for i := range rows {
		ps[i] = &rows[i]
	}
	return ps
}

// AddsUp reports whether every pool's lines add up to its GPU time.
func (r *Report) AddsUp() bool {
	for _, p := range r.Pools {
		if !p.AddsUp {
			return false
		}
	}
	return true
}
