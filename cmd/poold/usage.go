package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/usage"
)

// usageArgs is what follows "poold usage" in its usage line.
const usageArgs = "[reconcile --access-log FILE] [--since T] [--until T] [--by tenant|model|pool|day] [--format table|json|csv] [--spread none|tokens|holder] [flags]"

// usageCommand prints a usage and cost report from the ledger (or, with
// --postgres, the fleet's database), or, as "usage reconcile", compares the
// ledger with an access log: exit 0, 1 when the report does not add up, the
// reconciliation finds a difference or the ledger cannot be read, 2 on a
// usage error. The ledger's path and the prices are serve's settings (its
// flags here, POOLD_* variables, the settings file).
func usageCommand(args []string, stdout, stderr io.Writer) int {
	reconcile := len(args) > 0 && args[0] == "reconcile"
	if reconcile {
		args = args[1:]
	}
	fl := cli.NewFlagSet("poold usage")
	fl.String("config", "", "settings file (YAML); default "+defaultSettingsFile+" when it exists")
	fl.String("state-dir", "", "poold's state directory, where the ledger is (default: serve's state-dir)")
	fl.String("usage-db", "", "the ledger's SQLite file (default: serve's usage-db, else STATE_DIR/usage.db)")
	since := fl.String("since", "", "start of the window: RFC 3339, 2006-01-02, 2006-01-02T15:04, or a duration before now (default: 24h before --until; reconcile: everything)")
	until := fl.String("until", "", "end of the window (default now)")
	by := fl.String("by", "tenant", "group the rows by tenant, model, pool or day")
	format := fl.String("format", "table", "table, json or csv")
	split := fl.String("split", "", "share serving GPU time by tokens or lease time (default: usage-cost.split, else tokens)")
	spread := fl.String("spread", "", "share the pools' own time (idle, swapping, asleep, empty) among tenants: none, tokens (by their tokens on the pool) or holder (to the tenants of the model that held the pool) (default: usage-cost.spread, else none)")
	addPriceFlags(fl)
	pg := fl.String("postgres", "", "report over the whole fleet from this PostgreSQL DSN instead of the local ledger")
	accessLog := fl.String("access-log", "", "reconcile: the JSON access log to compare with the ledger")
	if code, ok := cli.ParseFlags(fl, usageArgs, args, stdout, stderr); !ok {
		return code
	}
	switch {
	case fl.NArg() > 0:
		return cli.UsageError(stderr, fl, usageArgs, fmt.Errorf("unexpected arguments: %s", strings.Join(fl.Args(), " ")))
	case reconcile && *accessLog == "":
		return cli.UsageError(stderr, fl, usageArgs, errors.New("reconcile needs --access-log"))
	case !reconcile && *accessLog != "":
		return cli.UsageError(stderr, fl, usageArgs, errors.New("--access-log is for reconcile"))
	}
	// The ledger's path and the prices come from serve's settings, which
	// the flags given here override.
	var pass []string
	fl.Visit(func(f *pflag.Flag) {
		if f.Name == "config" || f.Name == "state-dir" || f.Name == "usage-db" || slices.Contains(priceFlags, f.Name) {
			pass = append(pass, "--"+f.Name+"="+f.Value.String())
		}
	})
	v, err := cli.LoadSettings(serveFlags(), pass, serveSources)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return cli.ExitUsage
	}
	prices, err := loadPrices(v)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return cli.ExitUsage
	}
	db := v.String("usage-db")
	if db == "" {
		db = filepath.Join(v.String("state-dir"), "usage.db")
	}
	ctx := context.Background()
	if reconcile {
		return reconcileCommand(ctx, db, *accessLog, *since, *until, stdout, stderr)
	}
	win, err := usage.ParseWindow(usage.Query{Since: *since, Until: *until, By: *by, Format: *format, Split: *split, Spread: *spread}, &prices, time.Now())
	if err != nil {
		return cli.UsageError(stderr, fl, usageArgs, err)
	}
	var src usage.Source
	if *pg != "" {
		src, err = usage.OpenPostgres(ctx, *pg)
	} else {
		src, err = usage.OpenReader(ctx, db)
	}
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return cli.ExitFailure
	}
	defer src.Close()
	u, err := usage.Collect(ctx, src, win.Since, win.Until, win.Split)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return cli.ExitFailure
	}
	u.SpreadPoolTime(win.Spread)
	rep := u.Report(win.By, &prices)
	if err := rep.Write(stdout, win.Format); err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return cli.ExitFailure
	}
	if !rep.AddsUp() {
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// reconcileCommand compares the access log at logPath with the ledger at
// db over the window (by default, everything).
func reconcileCommand(ctx context.Context, db, logPath, since, until string, stdout, stderr io.Writer) int {
	now := time.Now()
	from, to := time.Unix(0, 0), now.Add(time.Minute)
	var err error
	if since != "" {
		if from, err = usage.ParseTime(since, now); err != nil {
			fmt.Fprintf(stderr, "poold usage reconcile: since: %v\n", err)
			return 2
		}
	}
	if until != "" {
		if to, err = usage.ParseTime(until, now); err != nil {
			fmt.Fprintf(stderr, "poold usage reconcile: until: %v\n", err)
			return 2
		}
	}
	f, err := os.Open(logPath)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage reconcile: %v\n", err)
		return 1
	}
	defer f.Close()
	lines, err := usage.ReadAccessLog(f)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage reconcile: %v\n", err)
		return 1
	}
	src, err := usage.OpenReader(ctx, db)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage reconcile: %v\n", err)
		return 1
	}
	defer src.Close()
	rc, err := usage.Reconcile(ctx, src, lines, from, to)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage reconcile: %v\n", err)
		return 1
	}
	if err := rc.Write(stdout); err != nil {
		return 1
	}
	if !rc.OK() {
		return 1
	}
	return 0
}
