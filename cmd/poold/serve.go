package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/engine"
	"github.com/poold/poold/internal/gpu"
	"github.com/poold/poold/internal/headerbudget"
	"github.com/poold/poold/internal/logqueue"
	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/proxy"
	"github.com/poold/poold/internal/statusapi"
)

// serve runs the daemon until ctx ends and returns the exit code.
func serve(ctx context.Context, args []string) int {
	s, err := loadSettings(args)
	if errors.Is(err, pflag.ErrHelp) {
		cli.PrintUsage(os.Stdout, serveFlags(), "[flags]")
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "poold: %v\n", err)
		return 2
	}
	log := newLogger(s)
	s.Loaded.Log(log)
	if err := run(ctx, s, log); err != nil {
		// Plain text, one problem per line: a refused profiles file lists them all.
		fmt.Fprintf(os.Stderr, "poold: %v\n", err)
		return 1
	}
	return 0
}

// run wires the daemon together and serves until ctx ends, then drains requests
// (bounded by the shutdown timeout) and stops every engine, or, with
// keep-engines-on-restart, leaves them running for the next poold.
func run(ctx context.Context, s settings, log *slog.Logger) error {
	cfg, raw, err := profile.Load(s.Profiles)
	if err != nil {
		return fmt.Errorf("loading profiles:\n%w", err)
	}
	sum := sha256.Sum256(raw)
	loadedAt := time.Now()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding poold's executable: %w", err)
	}
	host, _ := os.Hostname()

	reg := prometheus.NewRegistry()
	var h *proxy.Handler
	m := metrics.New(reg, func() []statusapi.Pool { return h.PoolStatus() }, version, revision())
	m.ConfigLoaded(true, loadedAt)
	m.Configure(cfg)
	notify := newNotifier(log)
	rl := &reloader{path: s.Profiles, m: m, notify: notify, log: log.With("component", "reload"), cfg: cfg, sum: sum, loadedAt: loadedAt}
	tenants, err := openTenants(s.Tenants, reg, log)
	if err != nil {
		return err
	}
	contain, err := containment(s.Containment, log)
	if err != nil {
		return err
	}
	ledger, err := openState(s.StateDir, contain, log)
	if err != nil {
		return err
	}
	defer ledger.Close()
	telemetry, closeGPUs, err := openGPUs(s, log.With("component", "gpu"))
	if err != nil {
		return err
	}
	defer closeGPUs()
	gpus := gpu.Shared(telemetry) // /status, scrapes and pools read the GPUs at once
	reg.MustRegister(metrics.GPUCollector(gpus))
	// With NVML, the pools check that stopped and sleeping engines release
	// their GPU memory, and evict sleepers when a start would not fit.
	var vram pool.VRAM
	if ok, _ := gpus.Available(); ok {
		vram = &gpu.Releaser{Provider: gpus, Timeout: s.VRAMReleaseTimeout}
	}
	accessOut, closeAccess, err := openAccessLog(s.AccessLog)
	if err != nil {
		return err
	}
	defer closeAccess()
	access := newAccessQueue(accessOut, int(s.AccessLogBuffer), log)
	defer access.Close(accessFlush)
	reg.MustRegister(metrics.AccessLogDropped(access.Dropped))
	// Closed after the pools have stopped (their last intervals) and the
	// requests have drained: deferred before both.
	usageLedger, err := openUsage(ctx, s, host, log, reg, gpus)
	if err != nil {
		return err
	}
	defer usageLedger.close()

	health := s.EngineHealthInterval
	if health == 0 {
		health = -1 // the setting's 0 is the pools' "never"
	}
	// With keep-engines-on-restart (and a ledger to find them by), engines
	// run under supervisors that outlive poold (docs/architecture.md).
	var shims *engine.Shims
	keep := s.KeepEngines && ledger != nil
	if keep {
		shims = &engine.Shims{Dir: ledger.Dir(), AdoptTimeout: s.AdoptTimeout}
	}
	pools := pool.NewSet(cfg, pool.Options{Launch: profile.Launch{Self: self, VLLM: s.VLLMCommand}, Logger: log, Observer: m, VRAM: vram, Ledger: ledger, Host: localHost(), Containment: contain, Shims: shims,
		RestartBackoff: s.RestartBackoff, MaxRestartBackoff: s.MaxRestartBackoff, HealthInterval: health, LogPolls: s.EngineLogPolls, Activity: usageLedger.activity()})
	takeOver(ctx, ledger, pools, keep, contain, log)
	engineStats := newEngineStats(s, func() []statusapi.Pool { return h.PoolStatus() }, pools.EngineAsleep, m, log)
	var reqMetrics *metrics.Metrics // nil: the proxy records no request metrics
	if s.Metrics {
		reqMetrics = m
	}
	h = proxy.New(cfg, pools, proxy.Options{
		MaxBodyBytes:   s.MaxBodyBytes,
		QueueBodyBytes: s.QueueBodyBudget,
		Logger:         log,
		AccessLog:      slog.New(slog.NewJSONHandler(access, nil)).With("component", "access"),
		Metrics:        reqMetrics,
		Tenants:        tenants.Gate(),
		// Scheduling: keep-alive comments for waiting streams, the admin API.
		KeepAliveInterval: s.KeepAliveInterval,
		AdminToken:        s.AdminToken,
		// Reliability: a hung engine answers 504 after the first, an event
		// larger than the second or a silence longer than the third ends
		// its stream.
		UpstreamHeaderTimeout: s.UpstreamHeaderTimeout,
		MaxEventBytes:         s.MaxEventBytes,
		StreamIdleTimeout:     s.StreamIdleTimeout,
		Degraded: func() []string {
			var reasons []string
			if access.DroppedWithin(accessDropWindow) {
				reasons = append(reasons, "access log lines are being dropped: its destination does not keep up")
			}
			if r := usageLedger.degraded(); r != "" {
				reasons = append(reasons, r)
			}
			return reasons
		},
		// The usage ledger: every finished request, and GET /usage.
		Usage:       usageLedger.requests(),
		UsageReport: usageLedger.report(s.Usage),
		EngineStats: engineStatsFill(engineStats),
		// Readiness for balancers: /ready's saturation thresholds.
		ReadyMaxEngineWaiting: s.ReadyMaxEngineWaiting,
		ReadyMaxKVCacheUsage:  s.ReadyMaxKVCacheUsage,
		Status: func() statusapi.Poold {
			return statusapi.Poold{
				Version:     version,
				Host:        host,
				Config:      rl.status(),
				Tenants:     tenants.status(),
				GPU:         gpuStatus(gpus),
				Containment: contain.Status(),
				Usage:       usageLedger.status(),
			}
		},
	})
	reg.MustRegister(metrics.EngineConnsClosed(h.EngineConnsClosed))
	h.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	rl.pools, rl.h = pools, h

	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.Listen, err)
	}
	// The headers of connections not yet authenticated are bounded
	// together, host-wide, and their memory returned after a flood.
	headers := headerbudget.New(s.HeaderBytesBudget)
	reg.MustRegister(metrics.HeaderBudgetRefused(headers.Refused))
	var draining atomic.Bool // set at SIGTERM (closeWhenDraining)
	srv := &http.Server{
		// Outermost: answers close their connections once draining; next, a
		// client that stops reading is cut whatever answers it.
		Handler:           closeWhenDraining(&draining, openai.WriteDeadline(tenants.Gate().Require(s.APIKeys.Require(h)), s.ClientWriteTimeout)),
		ReadTimeout:       s.ReadTimeout,
		ReadHeaderTimeout: s.ReadHeaderTimeout,
		MaxHeaderBytes:    s.MaxHeaderBytes,
		ConnState:         headers.ConnState,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	poolCtx, stopPools := context.WithCancel(context.Background())
	defer stopPools()
	pools.Run(poolCtx)
	waitEngineStats := runEngineStats(poolCtx, engineStats)
	defer h.Close()

	// The server and the systemd supervisor run in one group: a failed
	// server ends the group's context, which starts the shutdown as a
	// signal would. The pools run on their own context, which ends only
	// once the requests have drained.
	serving, servingCtx := errgroup.WithContext(ctx)
	// Watch before serving: a change made once /health answers is seen.
	waitReloads := rl.start(servingCtx, s.Watch, s.ReloadDebounce)
	waitTenants := tenants.start(servingCtx, s.Watch, s.ReloadDebounce)
	orNone := func(file string) string {
		if file == "" {
			return "none"
		}
		return file
	}
	gpuOn, _ := gpus.Available()
	log.Info("poold listening", "addr", ln.Addr().String(), "version", version,
		"settings", orNone(s.Loaded.File()), "profiles", s.Profiles, "profiles_sha256", hex.EncodeToString(sum[:]), "tenants", orNone(s.Tenants),
		"api_keys", s.APIKeys != nil || s.Tenants != "", "admin_api", s.AdminToken != "", "gpu_telemetry", gpuOn, "keep_engines_on_restart", keep)
	// Serving starts once the line is written: whoever gets an answer from
	// poold finds it in the log.
	serving.Go(func() error {
		if err := srv.Serve(headers.Listener(ln)); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving: %w", err)
		}
		return nil
	})
	notify.ready()
	serving.Go(func() error {
		notify.supervise(servingCtx, time.Second,
			func() string { return poolSummary(h.PoolStatus(), rl.status().LastError != nil) },
			func() error { return pools.Healthy(5 * time.Second) })
		return nil
	})

	<-servingCtx.Done()
	log.Info("shutting down: draining requests", "timeout", s.ShutdownTimeout)
	h.Drain()            // /health answers 503: balancers stop sending
	draining.Store(true) // every answer closes its connection
	notify.stopping()
	drainCtx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	stopHurry := hurryOnSecondSignal(log, cancel, pools)
	defer stopHurry()
	waitReloads()
	waitTenants()
	pools.Refuse()
	// The listener stays open until the requests in flight are done, so that
	// new ones get a 503 shutting_down rather than a refused connection.
	if !waitDrained(drainCtx, h) {
		log.Warn("drain bound reached with requests in flight: cutting them", "timeout", s.ShutdownTimeout)
		// Streams get a shutting_down error event, requests still waiting
		// for their engine a 503; a moment for those answers to leave.
		h.Cut()
	}
	cutCtx, cancelCut := context.WithTimeout(context.Background(), cutGrace)
	defer cancelCut()
	if err := srv.Shutdown(cutCtx); err != nil {
		log.Warn("requests still open after the cut; closing their connections", "err", err)
		_ = srv.Close()
	}
	servErr := serving.Wait()
	if keep {
		log.Info("leaving the engines running for the next poold to adopt: each stops by itself after adopt_timeout unless one does; poold stop-engines stops them now", "adopt_timeout", s.AdoptTimeout, "state_dir", s.StateDir)
		pools.Detach()
	} else {
		log.Info("stopping engines")
	}
	stopPools()
	pools.Wait()
	waitEngineStats()
	if servErr != nil {
		return servErr
	}
	log.Info("poold stopped")
	return nil
}

// cutGrace bounds the wait for the answers of requests cut at the end of the
// drain to reach their clients.
const cutGrace = 5 * time.Second

// hurryOnSecondSignal makes a second SIGTERM or SIGINT during a shutdown
// skip the rest of it: endDrain ends the drain at once (requests in flight
// are cut) and the pools' engine stops SIGKILL without waiting their grace.
// The returned function stops watching; call it when the shutdown is over.
func hurryOnSecondSignal(log *slog.Logger, endDrain context.CancelFunc, pools *pool.Set) (stop func()) {
	second := make(chan os.Signal, 1)
	signal.Notify(second, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-second:
			log.Warn("second signal: skipping the drain; cutting requests and killing engines now", "signal", sig.String())
			endDrain()
			pools.Hurry()
		case <-done:
		}
	}()
	return func() {
		signal.Stop(second)
		close(done)
	}
}

// gpuStatus is the "gpu" part of /status: every GPU's telemetry, or why there
// is none.
func gpuStatus(p gpu.Provider) statusapi.GPUs {
	if ok, reason := p.Available(); !ok {
		return statusapi.GPUs{Reason: reason}
	}
	devs, err := p.Devices()
	if err != nil {
		return statusapi.GPUs{Reason: err.Error()}
	}
	return statusapi.GPUs{Available: true, Devices: devs}
}

// The access log's queue: lines are flushed for at most accessFlush at
// exit, and /health reports the daemon degraded while lines were dropped
// within accessDropWindow.
const (
	accessFlush      = 5 * time.Second
	accessDropWindow = time.Minute
)

// newAccessQueue puts the access log's destination behind a queue that never
// blocks a request (a FIFO nobody reads, a full disk): lines that do not fit
// are dropped, counted (poold_access_log_dropped_lines_total) and warned
// about at most every 10 s.
func newAccessQueue(dst io.Writer, maxBytes int, log *slog.Logger) *logqueue.Writer {
	var q *logqueue.Writer
	warn := &rate.Sometimes{Interval: 10 * time.Second}
	q = logqueue.New(dst, maxBytes, func(err error) {
		warn.Do(func() { log.Warn("access log lines dropped", "dropped_total", q.Dropped(), "err", err) })
	})
	return q
}

// closeWhenDraining wraps next so that, once draining is set, every answer
// says Connection: close and clients reconnect elsewhere. Idle connections
// are not closed then (as SetKeepAlivesEnabled(false) would): a request
// that a client sent on one at that moment would be reset, and a POST is
// not retried; each is closed after its next answer, or at the end of the
// drain.
func closeWhenDraining(draining *atomic.Bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}
