package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/proxy"
)

// serve runs the daemon until ctx ends and returns the exit code.
func serve(ctx context.Context, args []string) int {
	s, err := loadSettings(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "poold: %v\n", err)
		return 2
	}
	log := newLogger(s)
	if err := run(ctx, s, log); err != nil {
		// Plain text, one problem per line: a refused profiles file lists them all.
		fmt.Fprintf(os.Stderr, "poold: %v\n", err)
		return 1
	}
	return 0
}

// run wires the daemon together and serves until ctx ends, then drains requests
// (bounded by the shutdown timeout) and stops every engine.
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
	m := metrics.New(reg, func() []pool.Status { return h.PoolStatus() }, version, revision())
	m.ConfigLoaded(true, loadedAt)

	pools := pool.NewSet(cfg, pool.Options{Self: self, Logger: log, Observer: m})
	h = proxy.New(cfg, pools, proxy.Options{
		MaxBodyBytes: s.MaxBodyBytes,
		Logger:       log,
		AccessLog:    slog.New(slog.NewJSONHandler(os.Stdout, nil)).With("component", "access"),
		Metrics:      m,
		Status: func() proxy.Status {
			return proxy.Status{
				Version: version,
				Host:    host,
				Config:  proxy.ConfigStatus{Path: s.Profiles, SHA256: hex.EncodeToString(sum[:]), LoadedAt: loadedAt},
				GPU:     proxy.GPUStatus{Available: false, Reason: "GPU telemetry is not implemented yet"},
			}
		},
	})
	h.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.Listen, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	poolCtx, stopPools := context.WithCancel(context.Background())
	defer stopPools()
	pools.Run(poolCtx)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("poold listening", "addr", ln.Addr().String(), "profiles", s.Profiles, "version", version)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)

	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: draining requests", "timeout", s.ShutdownTimeout)
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	pools.Refuse()
	drainCtx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("drain timed out; closing remaining connections", "err", err)
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("server", "err", err)
	}
	log.Info("stopping engines")
	stopPools()
	pools.Wait()
	log.Info("poold stopped")
	return nil
}
