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

// loadPrices reads the settings file's usage-cost block, if any.
func loadPrices(v *cli.Settings) (usage.Prices, error) {
	var p usage.Prices
	if !v.IsSet("usage-cost") {
		return p, nil
	}
	if err := v.Decode("usage-cost", &p); err != nil {
		return p, err
	}
	return p, p.Check()
}
