package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/fleet"
	"github.com/poold/poold/internal/headerbudget"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/rdb"
	"github.com/poold/poold/internal/watch"
)

// reloadDebounce is how long the hosts file must stay quiet before a reload.
const reloadDebounce = 250 * time.Millisecond

// serve runs fleetd until ctx ends and returns the exit code.
func serve(ctx context.Context, args []string) int {
	s, err := loadSettings(args)
	if errors.Is(err, pflag.ErrHelp) {
		cli.PrintUsage(os.Stdout, serveFlags(), "[flags]")
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleetd: %v\n", err)
		return 2
	}
	log := newLogger(s)
	s.Loaded.Log(log)
	if err := run(ctx, s, log); err != nil {
		fmt.Fprintf(os.Stderr, "fleetd: %v\n", err)
		return 1
	}
	return 0
}

// run wires fleetd together and serves until ctx ends, then lets in-flight
// requests finish (bounded by the shutdown timeout).
//
// Two groups of goroutines: the fleet's (host pollers, the hosts and
// tenants files' watchers and SIGHUP reloads), which must route until the
// last request is answered, and the server's; a failed server ends ctx's
// group and so starts the shutdown.
func run(ctx context.Context, s settings, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	opts := s.Fleet
	opts.Logger, opts.Metrics = log, fleet.NewMetrics(reg)
	f := fleet.New(opts)
	if err := f.LoadFile(s.Hosts); err != nil {
		return fmt.Errorf("loading hosts:\n%w", err)
	}
	hopts := s.Handler
	hopts.Logger = log
	var rc *rdb.Client
	if s.RedisURL != "" {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		rc, err = rdb.Open(rctx, s.RedisURL, rdb.Options{Logger: log, OnBreaker: breakerHook(opts.Metrics, log, s.RedisFailClosed)})
		cancel()
		if err != nil {
			return fmt.Errorf("redis-url: %w", err)
		}
		defer rc.Close()
		opts.Metrics.RedisConnected()
		hopts.Claims = rc
		log.Info("claims of new copies shared in redis")
	}
	if s.Tenants != "" {
		ts, err := loadTenants(s, rc, opts.Metrics, log)
		if err != nil {
			return err
		}
		hopts.Tenants = ts
	}

	fleetCtx, stopFleet := context.WithCancel(context.Background())
	defer stopFleet()
	changes, err := watch.File(fleetCtx, s.Hosts, reloadDebounce, log.With("component", "hosts-watch"))
	if err != nil {
		return fmt.Errorf("watching hosts file: %w", err)
	}
	var tenantChanges <-chan struct{}
	if s.Tenants != "" {
		if tenantChanges, err = watch.File(fleetCtx, s.Tenants, reloadDebounce, log.With("component", "tenants-watch")); err != nil {
			return fmt.Errorf("watching tenants file: %w", err)
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var fleetGroup errgroup.Group
	fleetGroup.Go(func() error { f.Run(fleetCtx); return nil })
	fleetGroup.Go(func() error { f.WatchFile(s.Hosts, changes); return nil }) // until fleetCtx closes changes
	if ts := hopts.Tenants; ts != nil {
		fleetGroup.Go(func() error { ts.Watch(tenantChanges); return nil })
		if rc != nil {
			fleetGroup.Go(func() error {
				ts.ShareLimits(fleetCtx, rc, replicaName(), fleet.DefaultShareEvery, s.RedisTimeout)
				return nil
			})
		}
	}
	fleetGroup.Go(func() error {
		for {
			select {
			case <-fleetCtx.Done():
				return nil
			case <-hup:
				if err := f.LoadFile(s.Hosts); err != nil {
					log.Error("hosts file refused on SIGHUP; keeping the hosts in force", "err", err)
				}
				if ts := hopts.Tenants; ts != nil {
					if err := ts.Reload(); err != nil {
						log.Error("tenants file refused on SIGHUP; keeping the tenants in force", "err", err)
					}
				}
			}
		}
	})
	defer func() {
		stopFleet()
		_ = fleetGroup.Wait()
	}()

	hopts.AccessLog = slog.New(slog.NewJSONHandler(os.Stdout, nil)).With("component", "access")
	h := fleet.NewHandler(f, hopts)
	defer h.Close()
	h.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.Listen, err)
	}
	// The headers of connections not yet authenticated are bounded
	// together, and their memory returned after a flood; outermost of the
	// handlers, a client that stops reading is cut whatever answers it.
	headers := headerbudget.New(s.HeaderBytesBudget)
	reg.MustRegister(fleet.HeaderBudgetRefused(headers.Refused))
	srv := &http.Server{Handler: openai.WriteDeadline(s.APIKeys.Require(h), s.ClientWriteTimeout), ReadTimeout: s.ReadTimeout, ReadHeaderTimeout: s.ReadHeaderTimeout,
		MaxHeaderBytes: s.MaxHeaderBytes, ConnState: headers.ConnState, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	serving, servingCtx := errgroup.WithContext(ctx)
	// Serving starts once the line is written: whoever gets an answer from
	// fleetd finds it in the log.
	log.Info("fleetd listening", "addr", ln.Addr().String(), "hosts", s.Hosts, "tenants", s.Tenants, "version", version)
	serving.Go(func() error {
		if err := srv.Serve(headers.Listener(ln)); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving: %w", err)
		}
		return nil
	})
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)

	<-servingCtx.Done()
	log.Info("shutting down: draining requests", "timeout", s.ShutdownTimeout)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	drainCtx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("drain timed out; closing remaining connections", "err", err)
		_ = srv.Close()
	}
	err = serving.Wait()
	stopFleet()
	_ = fleetGroup.Wait()
	if err != nil {
		return err
	}
	log.Info("fleetd stopped")
	return nil
}

// replicaName names this fleetd among the replicas sharing a Redis: its
// host's name and its process id.
func replicaName() string {
	name, err := os.Hostname()
	if err != nil {
		name = "fleetd"
	}
	return fmt.Sprintf("%s/%d", name, os.Getpid())
}

// breakerHook reports the changes of Redis's breaker in m and the log.
func breakerHook(m *fleet.Metrics, log *slog.Logger, failClosed bool) func(rdb.BreakerState, time.Duration) {
	rule := "tenant limits fail open"
	if failClosed {
		rule = "tenant limits fail closed"
	}
	return func(state rdb.BreakerState, backoff time.Duration) {
		open := state == rdb.BreakerOpen
		m.RedisBreaker(open)
		if open {
			log.Warn("redis breaker open: calls to redis failed in a row; not asking it, "+rule+" and claims are this fleetd's own, until a probe succeeds", "probeIn", backoff)
			return
		}
		log.Info("redis breaker closed: redis answers again")
	}
}

// loadTenants reads the tenants file, whose limits are kept in rc when
// there is one (shared by the replicas), else in this fleetd's memory.
func loadTenants(s settings, rc *rdb.Client, m *fleet.Metrics, log *slog.Logger) (*fleet.Tenants, error) {
	topts := fleet.TenantsOptions{Logger: log, Metrics: m}
	var limits *rdb.Limits
	if rc != nil {
		limits = rc.Limits()
		limits.FailClosed, limits.Timeout = s.RedisFailClosed, s.RedisTimeout
		topts.Limiter, topts.Shared, topts.FailClosed = limits, true, s.RedisFailClosed
	}
	ts, err := fleet.LoadTenants(s.Tenants, topts)
	if err != nil {
		return nil, fmt.Errorf("loading tenants:\n%w", err)
	}
	if limits != nil {
		limits.OnError, limits.OnReserveError, limits.OnSettleError, limits.OnRecover = ts.Unchecked, ts.ReserveUnchecked, ts.SettleLost, ts.Recovered
	}
	file, where := ts.Status()
	log.Info("tenants file loaded", "path", file.Path, "sha256", file.SHA256, "limits", where.Store, "failClosed", where.FailClosed)
	return ts, nil
}
