package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/poold/poold/internal/usage"
)

const usageHelp = `usage: poold usage [--since T] [--until T] [--by tenant|model|pool|day] [--format table|json|csv]
                   [--split tokens|lease] [--postgres DSN] [--state-dir DIR | --usage-db FILE] [--config FILE]
       poold usage reconcile --access-log FILE [--since T] [--until T] [--state-dir DIR | --usage-db FILE] [--config FILE]`

// usageCommand prints a usage and cost report from the ledger (or, with
// --postgres, the fleet's database), or reconciles the ledger with an
// access log: exit 0, 1 when the report does not add up, the
// reconciliation finds a difference or the ledger cannot be read, 2 on a
// usage error. The ledger and prices come from the same settings as serve's
// (flags, POOLD_* variables, the settings file).
func usageCommand(args []string, stdout, stderr io.Writer) int {
	reconcile := len(args) > 0 && args[0] == "reconcile"
	if reconcile {
		args = args[1:]
	}
	fl := pflag.NewFlagSet("usage", pflag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() { fmt.Fprintln(stderr, usageHelp) }
	fl.String("config", "", "settings file (YAML); default "+defaultSettingsFile+" when it exists")
	fl.String("state-dir", "/var/lib/poold", "poold's state directory, where the ledger is")
	fl.String("usage-db", "", "the ledger's SQLite file (default STATE_DIR/usage.db)")
	since := fl.String("since", "", "start of the window: RFC 3339, 2006-01-02, 2006-01-02T15:04, or a duration before now (default: 24h before --until)")
	until := fl.String("until", "", "end of the window (default now)")
	by := fl.String("by", "tenant", "group the rows by tenant, model, pool or day")
	format := fl.String("format", "table", "table, json or csv")
	split := fl.String("split", "", "share serving GPU time by tokens or lease time (default: usage-cost.split, else tokens)")
	pg := fl.String("postgres", "", "report over the whole fleet from this PostgreSQL DSN instead of the local ledger")
	accessLog := fl.String("access-log", "", "reconcile: the JSON access log to compare with the ledger")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() > 0 || (reconcile && *accessLog == "") || (!reconcile && *accessLog != "") {
		fmt.Fprintln(stderr, usageHelp)
		return 2
	}
	v := viper.New()
	v.SetEnvPrefix("POOLD")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if err := v.BindPFlags(fl); err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 2
	}
	if err := readSettingsFile(v); err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 2
	}
	prices, err := loadPrices(v)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 2
	}
	db := v.GetString("usage-db")
	if db == "" {
		db = filepath.Join(v.GetString("state-dir"), "usage.db")
	}
	ctx := context.Background()
	if reconcile {
		return reconcileCommand(ctx, db, *accessLog, *since, *until, stdout, stderr)
	}
	win, err := usage.ParseWindow(*since, *until, *by, *format, *split, usage.Split(prices.Split), time.Now())
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 2
	}
	var src usage.Source
	if *pg != "" {
		src, err = usage.OpenPostgres(ctx, *pg)
	} else {
		src, err = usage.OpenReader(ctx, db)
	}
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 1
	}
	defer src.Close()
	u, err := usage.Collect(ctx, src, win.Since, win.Until, win.Split)
	if err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 1
	}
	rep := u.Report(win.By, &prices)
	if err := rep.Write(stdout, win.Format); err != nil {
		fmt.Fprintf(stderr, "poold usage: %v\n", err)
		return 1
	}
	if !rep.AddsUp() {
		return 1
	}
	return 0
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
