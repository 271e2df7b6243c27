// Package enginesim is a faithful stand-in for `vllm serve`: an OpenAI-compatible
// HTTP server with vLLM's response shapes, streaming usage rules, health endpoints
// and Prometheus metrics, plus --sim-* flags that inject vLLM's timing and failure
// modes (slow loads, load failures, hangs, crashes mid-stream, SIGTERM-deaf children
// named VLLM::EngineCore). poold runs it as `poold engine-sim MODEL [flags]`.
package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"
)

var (
	// ErrLoadFailed is returned by Run for --sim-fail-load.
	ErrLoadFailed = errors.New("simulated load failure: CUDA out of memory")
	// ErrExitAfterReady is returned by Run for --sim-exit-after-ready.
	ErrExitAfterReady = errors.New("simulated engine death after ready")
)

// Main runs engine-sim with args (the words after "engine-sim") and returns the
// process exit code: 0 after SIGTERM/SIGINT or --help, 1 on a (simulated) failure,
// 2 on a bad command line. It logs to stderr.
func Main(args []string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "enginesim")
	cfg, err := ParseFlags(args)
	if errors.Is(err, ErrHelp) {
		fmt.Fprint(os.Stdout, Usage())
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "usage: poold engine-sim [MODEL] [flags] (see --help)\nengine-sim: error: %v\n", err)
		return 2
	}
	if cfg.Child {
		return runChild(cfg, logger)
	}
	cfg.reexecArgs = reexecPrefix(args)
	cfg.DevMode = devMode(os.Getenv("VLLM_SERVER_DEV_MODE"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-sigs:
				if cfg.IgnoreSigterm {
					logger.Warn("ignoring signal (--sim-ignore-sigterm)", "signal", sig.String())
					continue
				}
				logger.Info("received signal, shutting down", "signal", sig.String())
				cancel()
				return
			}
		}
	}()

	err = Run(ctx, cfg, logger)
	switch {
	case err == nil:
		logger.Info("exiting")
		return 0
	case errors.Is(err, ErrLoadFailed):
		return 1 // Run logged it
	default:
		logger.Error("exiting", "err", err)
		return 1
	}
}

// reexecPrefix returns the arguments between the executable and args in os.Args,
// which re-run engine-sim: ["engine-sim"] under poold, [] in a test binary whose
// TestMain calls Main(os.Args[1:]).
func reexecPrefix(args []string) []string {
	if n := len(os.Args) - len(args); n >= 1 && slices.Equal(os.Args[n:], args) {
		return slices.Clone(os.Args[1:n])
	}
	return []string{"engine-sim"}
}

// Run simulates the engine until ctx ends (SIGTERM under Main): it spawns the child
// if asked, waits the load delay (not listening), then serves cfg.Host:cfg.Port.
// When ctx ends it closes the listener and all connections (aborting in-flight
// requests, as vLLM does with the default shutdown timeout) and returns nil. It
// returns ErrLoadFailed for --sim-fail-load, ErrExitAfterReady for
// --sim-exit-after-ready, or a listen/serve error. A nil logger discards logs.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SpawnChild {
		pid, err := spawnChild(cfg)
		if err != nil {
			return fmt.Errorf("spawning engine core child: %w", err)
		}
		logger.Info("spawned engine core child", "pid", pid)
	}
	logger.Info("loading model", "model", cfg.Model, "served_model_names", cfg.ServedModelNames, "load_delay", cfg.LoadDelay)
	if !sleepCtx(ctx, cfg.LoadDelay) {
		logger.Info("terminated while loading")
		return nil
	}
	if cfg.FailLoad {
		logger.Error(ErrLoadFailed.Error(), "model", cfg.Model)
		return ErrLoadFailed
	}
	if cfg.NeverReady {
		logger.Info("model loaded; never becoming ready (--sim-never-ready)")
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("listening on %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	h := NewHandler(cfg, logger)
	defer func() { logger.Info("engine exiting", "sleep_aborted_requests", h.SleepAborted()) }()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	port := ln.Addr().(*net.TCPAddr).Port
	logger.Info("ready", "addr", ln.Addr().String(), "port", port)

	var exitc <-chan time.Time
	if cfg.ExitAfterReady > 0 {
		t := time.NewTimer(cfg.ExitAfterReady)
		defer t.Stop()
		exitc = t.C
	}
	select {
	case <-ctx.Done():
		_ = srv.Close()
		return nil
	case <-exitc:
		logger.Error("simulated engine death (--sim-exit-after-ready)")
		_ = srv.Close()
		return ErrExitAfterReady
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	}
}

// devMode reads VLLM_SERVER_DEV_MODE as vLLM does: an integer, non-zero is on.
func devMode(v string) bool {
	n, err := strconv.Atoi(v)
	return err == nil && n != 0
}

// sleepCtx waits d and reports whether ctx was still alive by then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// spawnChild starts `<exe> <reexecArgs> --sim-child` with argv[0] "VLLM::EngineCore"
// in this process's group, sharing stdout and stderr, and returns its pid. The child
// is reaped if it dies first, and left running when this process exits.
func spawnChild(cfg Config) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("finding executable: %w", err)
	}
	prefix := cfg.reexecArgs
	if prefix == nil {
		prefix = []string{"engine-sim"}
	}
	args := append(slices.Clone(prefix), "--sim-child", "--sim-child-lifetime", cfg.ChildLifetime.String())
	cmd := exec.Command(exe, args...)
	cmd.Args[0] = "VLLM::EngineCore"
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", exe, err)
	}
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

// runChild is the VLLM::EngineCore child: it ignores SIGTERM and sleeps for
// cfg.ChildLifetime (so a failed test cannot leave it behind forever).
func runChild(cfg Config, logger *slog.Logger) int {
	signal.Ignore(syscall.SIGTERM)
	logger = logger.With("process", "VLLM::EngineCore", "pid", os.Getpid())
	logger.Info("engine core child started; ignoring SIGTERM", "lifetime", cfg.ChildLifetime)
	time.Sleep(cfg.ChildLifetime)
	logger.Info("engine core child exiting after its lifetime")
	return 0
}
