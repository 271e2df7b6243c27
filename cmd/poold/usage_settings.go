package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/usage"
)

// usageSettings are the usage ledger's settings (docs/usage.md).
type usageSettings struct {
	// On records every request and pool interval in the ledger.
	On bool
	// DB is the ledger's SQLite file; Explicit says it was given (a default
	// that cannot be opened only disables the ledger, with a warning).
	DB       string
	Explicit bool
	// Postgres is the DSN rows are shipped to; empty ships nothing.
	Postgres string
	// Retention is how long rows are kept.
	Retention time.Duration
	// Prices is the settings file's usage-cost block.
	Prices usage.Prices
}

// usageFlags adds the ledger's flags to serve's.
func usageFlags(fl *pflag.FlagSet) {
	fl.Bool("usage", true, "record every request and pool interval in the usage ledger (docs/usage.md)")
	fl.String("usage-db", "", "the usage ledger's SQLite file (default STATE_DIR/usage.db)")
	fl.String("usage-postgres", "", "PostgreSQL DSN to ship usage rows to (prefer POOLD_USAGE_POSTGRES and a password in PGPASSWORD or ~/.pgpass)")
	fl.Duration("usage-retention", usage.DefaultRetention, "how long usage rows are kept in the ledger (those not shipped yet are kept longer)")
	addPriceFlags(fl)
}

// priceFlags are the prices that a flag or the environment sets as well as
// the settings file's usage-cost block, whose keys they override.
var priceFlags = []string{"usage-currency", "usage-gpu-hour", "usage-prompt-per-million", "usage-completion-per-million"}

// addPriceFlags adds priceFlags to fl.
func addPriceFlags(fl *pflag.FlagSet) {
	fl.String("usage-currency", "", "the currency of the usage report's prices (overrides usage-cost.currency; default USD)")
	fl.Float64("usage-gpu-hour", 0, "the price of a GPU-hour in usage reports, where no pool or GPU model has its own (overrides usage-cost.gpu-hour)")
	fl.Float64("usage-prompt-per-million", 0, "the price of a million prompt tokens in usage reports (overrides usage-cost.prompt-per-million)")
	fl.Float64("usage-completion-per-million", 0, "the price of a million completion tokens in usage reports (overrides usage-cost.completion-per-million)")
}

// loadUsageSettings reads the ledger's settings; stateDir is the default
// directory of its database.
func loadUsageSettings(v *cli.Settings, stateDir string) (usageSettings, []error) {
	u := usageSettings{On: v.Bool("usage"), DB: v.String("usage-db"), Postgres: v.String("usage-postgres"), Retention: v.Duration("usage-retention")}
	var errs []error
	u.Explicit = u.DB != ""
	if !u.Explicit {
		u.DB = filepath.Join(stateDir, "usage.db")
	}
	if u.Retention <= 0 {
		errs = append(errs, errors.New("usage-retention: must be positive"))
	}
	if u.Postgres != "" {
		if err := usage.CheckDSN(u.Postgres); err != nil {
			errs = append(errs, fmt.Errorf("usage-postgres: %w", err))
		}
	}
	prices, err := loadPrices(v)
	if err != nil {
		errs = append(errs, err)
	}
	u.Prices = prices
	return u, errs
}

// loadPrices reads the settings file's usage-cost block, if any, then the
// priceFlags given (by flag, environment or the file's top level) over it.
// The currency is USD unless one is set.
func loadPrices(v *cli.Settings) (usage.Prices, error) {
	var p usage.Prices
	if v.IsSet("usage-cost") {
		if err := v.Decode("usage-cost", &p); err != nil {
			return p, err
		}
	}
	if v.Given("usage-currency") {
		p.Currency = v.String("usage-currency")
	}
	var errs []error
	for _, f := range []struct {
		name  string
		price *float64
	}{{"usage-gpu-hour", &p.GPUHour}, {"usage-prompt-per-million", &p.PromptPerMillion}, {"usage-completion-per-million", &p.CompletionPerMillion}} {
		if !v.Given(f.name) {
			continue
		}
		if *f.price = v.Float64(f.name); *f.price < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", f.name))
		}
	}
	if p.Currency == "" {
		p.Currency = "USD"
	}
	if err := p.Check(); err != nil {
		errs = append(errs, err)
	}
	return p, errors.Join(errs...)
}
