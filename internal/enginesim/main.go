// Package enginesim is a faithful stand-in for `vllm serve`: an OpenAI-compatible
// HTTP server with vLLM's response shapes, streaming usage rules, health endpoints,
// sleep mode and Prometheus metrics, plus --sim-* flags that inject vLLM's timing
// and failure modes (slow loads, load failures, hangs, crashes mid-stream, a dead
// engine core, SIGTERM-deaf children named VLLM::EngineCore, simulated GPU memory).
// poold runs it as `poold engine-sim MODEL [flags]`.
//
// What a model serves stands in for vLLM's reading of its architecture (see
// Config.kind): a generative model serves /v1/chat/completions and
// /v1/completions; a pooling model (--runner pooling, or a name with "embed",
// "rerank", "bge", "e5" or "gte") serves /v1/embeddings, /pooling, /classify,
// /score, /v1/score, /rerank and /v1/rerank; a transcription model (a name with
// "whisper") serves /v1/audio/transcriptions and /v1/audio/translations. Every
// model serves /tokenize, /detokenize, /v1/models, /health, /ping and /metrics;
// any other path is a 404, as in vLLM. Every POST route but the audio ones
// takes JSON, and answers 400 unless the request says so (jsonContent).
// Every request gets an access log line on stdout, as vLLM prints uvicorn's
// (logAccess).
//
// The environment is read as vLLM reads it (ReadEnv): VLLM_SERVER_DEV_MODE,
// VLLM_API_KEY, VLLM_KEEP_ALIVE_ON_ENGINE_DEATH, VLLM_HTTP_TIMEOUT_KEEP_ALIVE and
// CUDA_VISIBLE_DEVICES.
package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/poold/poold/internal/simgpu"
)

var (
	// ErrLoadFailed is returned by Run for --sim-fail-load.
	ErrLoadFailed = errors.New("simulated load failure: CUDA out of memory")
	// ErrExitAfterReady is returned by Run for --sim-exit-after-ready.
	ErrExitAfterReady = errors.New("simulated engine death after ready")
	// ErrEngineDead is returned by Run when the watchdog found the engine core
	// dead (--sim-core-dies-after) and VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is unset.
	ErrEngineDead = errors.New("engine core is dead: shutting down the server")
)

// vllmError is a failure that vLLM reports with a line of its own: Error is
// that line, and errors.Is matches the sentinel.
type vllmError struct {
	is   error
	line string
}

func (e *vllmError) Error() string { return e.line }
func (e *vllmError) Unwrap() error { return e.is }

// Main runs engine-sim with args (the words after "engine-sim") and returns the
// process exit code: 0 after SIGTERM/SIGINT or --help, 1 on a (simulated) failure,
// 2 on a bad command line. It logs to stderr, and ignores SIGPIPE as CPython
// does: a write to a closed stdout or stderr fails, and the process lives on.
func Main(args []string) int {
	signal.Ignore(syscall.SIGPIPE)
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
	if err := ReadEnv(&cfg, os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.reexecArgs = reexecPrefix(args)

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
	var ve *vllmError
	switch {
	case err == nil:
		logger.Info("exiting")
		return 0
	case errors.Is(err, ErrLoadFailed):
		return 1 // Run logged it
	case errors.As(err, &ve):
		fmt.Fprintln(os.Stderr, ve.line)
		return 1
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

// Run simulates the engine until ctx ends (SIGTERM under Main). It spawns the
// child if asked, binds the port (failing at once if it is taken, as vLLM
// does), runs vLLM's GPU memory check against --sim-gpu-dir, waits the load
// delay (bound but not listening: connections are refused), then serves. When
// ctx ends it closes the listener and all connections (aborting in-flight
// requests, as vLLM does with the default shutdown timeout, 0), or with
// --shutdown-timeout N first drains for up to N seconds (Server.shutdown);
// then it releases its GPU memory and returns nil. It returns ErrLoadFailed for --sim-fail-load,
// ErrExitAfterReady for --sim-exit-after-ready, ErrEngineDead when the engine
// core died, or an error wrapping ErrPortInUse, ErrGPUMemory or a serve error.
// A nil logger discards logs.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogLineBytes > 0 {
		line := "INFO engine-sim start-up line "
		line = (line + strings.Repeat("x", max(cfg.LogLineBytes-len(line), 0)))[:cfg.LogLineBytes]
		fmt.Fprintln(os.Stderr, line)
	}
	holder := os.Getpid() // the process that holds the GPU memory
	if cfg.SpawnChild {
		pid, err := spawnChild(cfg)
		if err != nil {
			return fmt.Errorf("spawning engine core child: %w", err)
		}
		logger.Info("spawned engine core child", "pid", pid)
		holder = pid
	}
	sock, err := bindTCP(cfg.Host, cfg.Port, cfg.ReusePort, cfg.PortMessage)
	if err != nil {
		return err
	}
	listening := false
	defer func() {
		if !listening {
			sock.close()
		}
	}()
	var mem *gpuMemory
	if cfg.SimGPUDir != "" {
		if mem, err = claimGPUs(cfg, holder); err != nil {
			return err
		}
		if holder == os.Getpid() {
			// A child's claim outlives this process, as a surviving
			// EngineCore keeps its GPU memory.
			defer func() {
				if err := mem.release(); err != nil {
					logger.Error("releasing simulated gpu memory", "err", err)
				}
			}()
		}
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
	ln, err := sock.listen()
	if err != nil {
		return err
	}
	listening = true
	h := NewHandler(cfg, logger)
	h.mem = mem
	h.access = os.Stdout
	defer h.stopIdleSleep() // before the GPU memory is released
	defer func() { logger.Info("engine exiting", "sleep_aborted_requests", h.SleepAborted()) }()
	keepAlive := cfg.KeepAlive
	if keepAlive <= 0 {
		keepAlive = 5 * time.Second
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       keepAlive,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("ready", "addr", ln.Addr().String(), "port", sock.port, "task", h.kind.String())

	exitc := after(cfg.ExitAfterReady)
	diec := after(cfg.CoreDiesAfter)
	watchdog := time.NewTicker(max(cfg.WatchdogInterval, time.Millisecond))
	defer watchdog.Stop()
	keptAlive := false // logged that the dead core did not end the server
	for {
		select {
		case <-ctx.Done():
			if cfg.ShutdownTimeout > 0 {
				h.shutdown(time.Duration(cfg.ShutdownTimeout) * time.Second)
				shutDown(srv)
			} else {
				_ = srv.Close()
			}
			return nil
		case <-exitc:
			logger.Error("simulated engine death (--sim-exit-after-ready)")
			_ = srv.Close()
			return ErrExitAfterReady
		case <-diec:
			diec = nil
			h.killCore()
		case <-h.deadHit:
		case <-watchdog.C:
		case err := <-errc:
			return fmt.Errorf("serving: %w", err)
		}
		switch {
		case !h.coreDead():
		case !cfg.KeepAliveOnEngineDeath:
			logger.Error(ErrEngineDead.Error())
			shutDown(srv)
			return ErrEngineDead
		case !keptAlive:
			keptAlive = true
			logger.Warn("engine core is dead; staying up (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)")
		}
	}
}

// deadShutdown bounds the wait for the answers under way when the server
// ends for a dead engine core.
const deadShutdown = 5 * time.Second

// shutDown ends the server of a dead engine core as vLLM's launcher does
// (vllm/entrypoints/launcher.py sets uvicorn's should_exit): it listens no
// more and closes idle connections, and the answers under way, which the
// dead core ended already, are finished, up to deadShutdown, before every
// connection is closed.
func shutDown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), deadShutdown)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		_ = srv.Close()
	}
}

// claimGPUs opens --sim-gpu-dir and runs vLLM's start-up memory check for the
// GPUs in CUDA_VISIBLE_DEVICES (default 0), claiming their memory for holder.
func claimGPUs(cfg Config, holder int) (*gpuMemory, error) {
	dir, err := simgpu.Open(cfg.SimGPUDir)
	if err != nil {
		return nil, err
	}
	m := &gpuMemory{
		dir: dir, pid: holder, devices: cfg.VisibleDevices,
		util: cfg.GPUMemoryUtilization, residue: uint64(cfg.SleepResidueMiB) << 20,
	}
	if len(m.devices) == 0 {
		m.devices = []int{0}
	}
	if err := m.start(); err != nil {
		return nil, err
	}
	return m, nil
}

// after returns a channel that receives once d has passed, or nil (never)
// when d is not positive.
func after(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return time.After(d)
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
