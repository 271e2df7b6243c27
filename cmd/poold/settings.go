package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/engine"
	"github.com/poold/poold/internal/gpu"
	"github.com/poold/poold/internal/headerbudget"
	"github.com/poold/poold/internal/logqueue"
	"github.com/poold/poold/internal/openai"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/proxy"
)

// defaultSettingsFile is read when it exists and no --config is given.
const defaultSettingsFile = "/etc/poold/poold.yaml"

// vllmCommandSetting is the setting of the launcher of the profiles with a
// model and no command, which serve and check both read.
const vllmCommandSetting = "vllm-command"

// vllmCommandUsage is the help of the vllm-command flag.
const vllmCommandUsage = `command line that starts vLLM for the profiles with a model and no command, split on spaces; poold adds --model MODEL and its flags. vLLM's CPU build needs "VENV/bin/python -m vllm.entrypoints.openai.api_server"`

// errVLLMCommandEmpty is the error of a vllm-command of no word.
var errVLLMCommandEmpty = errors.New(`vllm-command: must not be empty: it is the command line that starts vLLM, such as "vllm serve"`)

// settings are the daemon's own settings (the profiles file says what to serve).
// Precedence, highest first: flags, POOLD_* environment variables, the settings
// file, defaults.
type settings struct {
	Listen       string
	Profiles     string
	LogLevel     slog.Level
	LogFormat    string
	MaxBodyBytes int64
	// QueueBodyBudget bounds the bodies that requests waiting for a lease
	// hold together, host-wide.
	QueueBodyBudget int64
	ShutdownTimeout time.Duration
	// KeepAliveInterval is how often a stream waiting for a swap gets an SSE
	// comment line; zero disables them.
	KeepAliveInterval time.Duration
	// AdminToken enables the admin API (explicit load and unload, clearing a
	// restart backoff) for requests bearing it; empty leaves the API unbound. From admin-token or the first
	// line of admin-token-file.
	AdminToken string
	// AccessLog is where the JSON access log goes: "stdout", "stderr" or a
	// file path (appended to). AccessLogBuffer bounds, in bytes, the lines
	// held while that destination is slow.
	AccessLog       string
	AccessLogBuffer int64
	// Tenants is the tenants file (docs/tenancy.md): API keys to tenants,
	// their limits, output caps, models and tiers; "" means none, and every
	// request is served as today, client "none".
	Tenants string
	// VRAMReleaseTimeout bounds the wait for a stopped or sleeping engine's GPU memory.
	VRAMReleaseTimeout time.Duration
	// GPUSimDir, when set, is a simulated-GPU directory (engine-sim's
	// --sim-gpu-dir) read instead of NVML: for the simulator and the demo.
	GPUSimDir string
	// StateDir holds the engines file and the lock (crash clean-up).
	StateDir string
	// VLLMCommand is the launcher of the profiles with a model and no
	// command (profile.Launch.VLLM): vllm-command split into words.
	VLLMCommand []string
	// Containment is how engines' processes are kept account of: "auto"
	// (a cgroup per engine where poold's cgroup is delegated to it, else
	// process groups), "cgroup" (required) or "process-group".
	Containment string
	// KeepEngines starts each engine under a supervisor of its own
	// (`poold engine-shim`), so that a restart keeps it: poold detaches at
	// shutdown and the next poold adopts it. AdoptTimeout is how long a
	// supervisor keeps its engine with no poold attached.
	KeepEngines  bool
	AdoptTimeout time.Duration
	// Watch makes poold reload the profiles file when it changes; SIGHUP
	// reloads either way.
	Watch bool
	// ReloadDebounce is how long the profiles file must stay quiet after a
	// change before it is reloaded.
	ReloadDebounce time.Duration

	// Limits and faults (docs/reliability.md). UpstreamHeaderTimeout bounds
	// the wait for an engine's response headers (0: none). ReadTimeout bounds
	// reading a request, body included, and ReadHeaderTimeout its headers;
	// MaxHeaderBytes caps the headers' size, HeaderBytesBudget the header
	// bytes of every connection still in its headers together
	// (headerbudget), MaxEventBytes one server-sent event of an engine's
	// stream. RestartBackoff and MaxRestartBackoff
	// space out restarts of a failing engine. EngineHealthInterval is how
	// often a serving engine's /health is polled (0: never).
	UpstreamHeaderTimeout, ReadTimeout, ReadHeaderTimeout time.Duration
	MaxHeaderBytes                                        int
	HeaderBytesBudget                                     int64
	MaxEventBytes                                         int64
	EngineHealthInterval                                  time.Duration
	RestartBackoff, MaxRestartBackoff                     time.Duration
	// EngineLogPolls logs the access-log lines engines print for poold's own
	// polls of them like their other output; false (the default) logs them
	// at debug level only, counted (pool.Options.LogPolls).
	EngineLogPolls bool
	// StreamIdleTimeout bounds an engine's silence within an answer: between
	// complete events of a stream, between bytes of a plain body (0: none).
	StreamIdleTimeout time.Duration
	// ClientWriteTimeout bounds how long one write of an answer may wait for
	// a client that does not read (openai.WriteDeadline; 0: none).
	ClientWriteTimeout time.Duration
	// APIKeys, when non-nil, is required on the OpenAI API (api-keys,
	// api-keys-file); only the keys' hashes are kept.
	APIKeys *openai.APIKeys
	// Metrics records every request in the request metrics (requests,
	// latencies, tokens); false records none, and /metrics serves only the
	// pool, swap, engine, GPU, build and Go collectors.
	Metrics bool
	// EngineMetricsInterval is how often each awake engine's /metrics is
	// scraped (engineStats in /status, the poold_engine_* gauges, /ready);
	// zero scrapes none. EngineMetricsTimeout bounds one scrape.
	EngineMetricsInterval, EngineMetricsTimeout time.Duration
	// ReadyMaxEngineWaiting and ReadyMaxKVCacheUsage are /ready's
	// saturation thresholds (proxy.Options).
	ReadyMaxEngineWaiting int
	ReadyMaxKVCacheUsage  float64
	// Loaded says where the settings came from, for the start-up log.
	Loaded *cli.Settings
	// Usage is the usage ledger's (usage_settings.go).
	Usage usageSettings
}

// serveSources are where serve's settings come from besides its flags.
var serveSources = cli.Sources{EnvPrefix: "POOLD", FileFlag: "config", DefaultFile: defaultSettingsFile, FileOnly: []string{"clients", "usage-cost"}}

// serveFlags defines serve's flags.
func serveFlags() *pflag.FlagSet {
	fl := cli.NewFlagSet("poold serve")
	fl.String("config", "", "settings file (YAML); default "+defaultSettingsFile+" when it exists")
	fl.String("listen", "127.0.0.1:8080", "address to serve the API on")
	fl.String("profiles", "", "profiles JSON file (required)")
	fl.String("tenants", "", "tenants JSON file: API keys to tenants, with their limits, output caps, models and fair-share tiers (docs/tenancy.md); watched like the profiles file")
	fl.String("log-level", "info", "log level: debug, info, warn or error")
	fl.String("log-format", "text", "log format: json or text")
	cli.BytesFlag(fl, "max-body-bytes", openai.DefaultMaxBodyBytes, "request body limit (bytes, or with a unit: 32MiB)")
	cli.BytesFlag(fl, openai.MaxEventSetting, openai.DefaultMaxEvent, "largest server-sent event of an engine's stream (a larger one ends the stream with an error event); prompt_logprobs in a stream's first chunk may need more")
	cli.BytesFlag(fl, "queue-body-budget", proxy.DefaultQueueBodyBytes, "request bodies that requests waiting for a model may hold together, host-wide (503 queue_budget past it)")
	fl.Duration("shutdown-timeout", 2*time.Minute, "how long in-flight requests may run on after SIGTERM before they are cut")
	fl.Duration("keepalive-interval", 10*time.Second, "interval of the SSE comments sent to a stream waiting for a swap; 0 disables them")
	fl.String("admin-token", "", "token enabling the admin API (prefer POOLD_ADMIN_TOKEN or admin-token-file: flags show in ps)")
	fl.String("admin-token-file", "", "file holding the admin token")
	fl.String("access-log", "stdout", "where the JSON access log goes: stdout, stderr or a file path")
	cli.BytesFlag(fl, "access-log-buffer", logqueue.DefaultMaxBytes, "access-log lines held while the destination is slow; lines beyond are dropped and counted, never waited for")
	fl.Duration("vram-release-timeout", gpu.DefaultReleaseTimeout, "how long to wait for a stopped or sleeping engine's GPU memory to be released (with NVML)")
	fl.String("gpu-sim-dir", "", "read GPU telemetry from this simulated-GPU directory (engine-sim --sim-gpu-dir) instead of NVML: for the simulator and the demo")
	_ = fl.MarkHidden("gpu-sim-dir")
	fl.String(vllmCommandSetting, profile.DefaultVLLMCommand, vllmCommandUsage)
	fl.String("state-dir", "/var/lib/poold", "directory for poold's state: the engines it runs, so that a restart after a crash stops their leftovers")
	fl.Bool("keep-engines-on-restart", true, "keep the engines running across a restart of poold, under supervisors that the next poold adopts them from (docs/operations.md, Upgrades); off, a shutdown stops them")
	fl.Duration("adopt-timeout", time.Minute, "with keep-engines-on-restart, how long an engine runs on with no poold in front of it (after a crash, or a shutdown with no restart) before its supervisor stops it")
	fl.String("containment", engine.ModeAuto, "how engines' processes are contained: auto (a cgroup per engine when poold's cgroup is delegated to it, else process groups), cgroup or process-group")
	fl.Bool("watch", true, "reload the profiles file when it changes (SIGHUP reloads either way)")
	fl.Duration("reload-debounce", 200*time.Millisecond, "quiet time after a change to the profiles file before it is reloaded")
	fl.Duration("upstream-header-timeout", 10*time.Minute, "how long an engine may take to start answering a request (504 after); 0 waits as long as the client")
	fl.Duration("stream-idle-timeout", 2*time.Minute, "how long an engine may go without completing an event of a stream (or sending a byte of a plain answer) before the answer ends (engine_timeout) and the engine is restarted; 0: no bound")
	fl.Duration(openai.ClientWriteTimeoutSetting, time.Minute, "how long a client may accept no byte of an answer before it is cut (outcome client_stalled), its engine slot released and the engine's request cancelled; 0: no bound")
	fl.Duration("read-timeout", time.Minute, "how long a client may take to send a whole request, body included (408 after)")
	fl.Duration("read-header-timeout", 10*time.Second, "how long a client may take to send a request's headers")
	cli.BytesFlag(fl, "max-header-bytes", headerbudget.DefaultMaxHeaderBytes, "largest request header block accepted (431 above)")
	cli.BytesFlag(fl, "header-bytes-budget", headerbudget.DefaultMaxBytes, "header bytes that connections still sending their headers may hold together, host-wide (503 and closed past it; blocks over 16KiB get three quarters)")
	fl.Duration("engine-health-interval", pool.DefaultHealthInterval, "how often a serving engine's /health is polled; a 503 (vLLM's dead engine core) fails the engine over; 0 never polls")
	fl.Bool("engine-log-polls", false, "log the access-log lines engines print for poold's own polls of them (GET /health, /metrics, /v1/models, /is_sleeping) at info like their other output; by default they are logged at debug level only, counted in poold_engine_log_dropped_lines_total")
	fl.Duration("restart-backoff", pool.DefaultRestartBackoff, "wait before restarting an engine that failed twice in a row, doubling with each further failure")
	fl.Duration("restart-backoff-max", pool.DefaultMaxRestartBackoff, "cap of the restart backoff; an engine ready this long ends a failure streak")
	fl.StringSlice("api-keys", nil, "API keys required on /v1 (comma-separated; prefer POOLD_API_KEYS or api-keys-file: flags show in ps)")
	fl.String("api-keys-file", "", "file of API keys required on /v1, one per line (KEY or sha256:HEX; # comments)")
	fl.Bool("metrics", true, "record per-request metrics (requests, latencies, tokens); false leaves /metrics with the pool, swap, GPU and Go collectors")
	fl.Duration("engine-metrics-interval", time.Second, "how often each awake engine's /metrics is read for its load (engineStats in /status, the poold_engine_* gauges, /ready); 0 disables")
	fl.Duration("engine-metrics-timeout", 2*time.Second, "how long one read of an engine's /metrics may take before it counts as failed")
	fl.Int("ready-max-engine-waiting", proxy.DefaultReadyMaxEngineWaiting, "GET /ready answers 503 while a pool with demand has an engine queueing more requests than this")
	fl.Float64("ready-max-kv-cache-usage", proxy.DefaultReadyMaxKVCacheUsage, "GET /ready answers 503 while a pool with demand has an engine using more of its KV cache than this (0 to 1)")
	usageFlags(fl)
	return fl
}

// loadSettings parses serve's flags and merges them with the environment and
// the optional settings file. -h or --help returns pflag.ErrHelp.
func loadSettings(args []string) (settings, error) {
	v, err := cli.LoadSettings(serveFlags(), args, serveSources)
	if err != nil {
		return settings{}, err
	}

	s := settings{Loaded: v}
	s.Listen = v.String("listen")
	s.Profiles = v.String("profiles")
	s.LogFormat = v.String("log-format")
	s.MaxBodyBytes = v.Bytes("max-body-bytes")
	s.MaxEventBytes = v.Bytes(openai.MaxEventSetting)
	s.QueueBodyBudget = v.Bytes("queue-body-budget")
	s.ShutdownTimeout = v.Duration("shutdown-timeout")
	s.KeepAliveInterval = v.Duration("keepalive-interval")
	s.AccessLog = v.String("access-log")
	s.AccessLogBuffer = v.Bytes("access-log-buffer")
	s.VRAMReleaseTimeout = v.Duration("vram-release-timeout")
	s.GPUSimDir = v.String("gpu-sim-dir")
	s.StateDir = v.String("state-dir")
	s.VLLMCommand = strings.Fields(v.String(vllmCommandSetting))
	s.Containment = v.String("containment")
	s.KeepEngines = v.Bool("keep-engines-on-restart")
	s.AdoptTimeout = v.Duration("adopt-timeout")
	s.Watch = v.Bool("watch")
	s.ReloadDebounce = v.Duration("reload-debounce")
	s.Metrics = v.Bool("metrics")
	s.EngineMetricsInterval = v.Duration("engine-metrics-interval")
	s.EngineMetricsTimeout = v.Duration("engine-metrics-timeout")
	s.ReadyMaxEngineWaiting = v.Int("ready-max-engine-waiting")
	s.ReadyMaxKVCacheUsage = v.Float64("ready-max-kv-cache-usage")
	var errs []error
	if s.EngineMetricsInterval < 0 {
		errs = append(errs, errors.New("engine-metrics-interval: must not be negative"))
	}
	if s.EngineMetricsTimeout <= 0 {
		errs = append(errs, errors.New("engine-metrics-timeout: must be positive"))
	}
	if s.ReadyMaxEngineWaiting < 1 {
		errs = append(errs, fmt.Errorf("ready-max-engine-waiting: must be at least 1, not %d", s.ReadyMaxEngineWaiting))
	}
	if !(s.ReadyMaxKVCacheUsage > 0 && s.ReadyMaxKVCacheUsage <= 1) {
		errs = append(errs, fmt.Errorf("ready-max-kv-cache-usage: must be above 0 and at most 1, not %v", s.ReadyMaxKVCacheUsage))
	}
	if s.KeepAliveInterval < 0 {
		errs = append(errs, errors.New("keepalive-interval: must not be negative"))
	}
	if s.AdminToken, err = adminToken(v.String("admin-token"), v.String("admin-token-file")); err != nil {
		errs = append(errs, err)
	}
	if v.IsSet("clients") {
		errs = append(errs, errors.New("clients: client classes are replaced by the tenants file (tenants; docs/tenancy.md): each class becomes a tenant, its keys the tenant's keys"))
	}
	if s.AccessLog == "" {
		errs = append(errs, errors.New("access-log: must be stdout, stderr or a file path"))
	}
	if s.AccessLogBuffer <= 0 {
		errs = append(errs, fmt.Errorf("access-log-buffer: must be positive, not %d", s.AccessLogBuffer))
	}
	if s.AdoptTimeout <= 0 {
		errs = append(errs, errors.New("adopt-timeout: must be positive"))
	}
	if s.StateDir == "" {
		errs = append(errs, errors.New("state-dir: must not be empty"))
	}
	if len(s.VLLMCommand) == 0 {
		errs = append(errs, errVLLMCommandEmpty)
	}
	switch s.Containment {
	case engine.ModeAuto, engine.ModeCgroup, engine.ModeProcessGroup:
	default:
		errs = append(errs, fmt.Errorf("containment: %q is not auto, cgroup or process-group", s.Containment))
	}
	var usageErrs []error
	s.Usage, usageErrs = loadUsageSettings(v, s.StateDir)
	errs = append(errs, usageErrs...)
	s.UpstreamHeaderTimeout = v.Duration("upstream-header-timeout")
	s.StreamIdleTimeout = v.Duration("stream-idle-timeout")
	s.ClientWriteTimeout = v.Duration(openai.ClientWriteTimeoutSetting)
	s.ReadTimeout = v.Duration("read-timeout")
	s.ReadHeaderTimeout = v.Duration("read-header-timeout")
	s.MaxHeaderBytes = int(v.Bytes("max-header-bytes"))
	s.HeaderBytesBudget = v.Bytes("header-bytes-budget")
	s.RestartBackoff = v.Duration("restart-backoff")
	s.EngineHealthInterval = v.Duration("engine-health-interval")
	s.EngineLogPolls = v.Bool("engine-log-polls")
	if s.EngineHealthInterval < 0 {
		errs = append(errs, errors.New("engine-health-interval: must not be negative"))
	}
	s.MaxRestartBackoff = v.Duration("restart-backoff-max")
	errs = append(errs, s.checkLimits()...)
	if s.APIKeys, err = openai.LoadAPIKeys(v.Strings("api-keys"), v.String("api-keys-file")); err != nil {
		errs = append(errs, err)
	}
	s.Tenants = v.String("tenants")
	if s.Tenants != "" && s.APIKeys != nil {
		errs = append(errs, errors.New("tenants and api-keys are exclusive: with a tenants file, its keys are the keys (move the api-keys into a tenant)"))
	}
	if s.ReloadDebounce < 0 {
		errs = append(errs, errors.New("reload-debounce: must not be negative"))
	}
	if s.VRAMReleaseTimeout <= 0 {
		errs = append(errs, fmt.Errorf("vram-release-timeout: must be positive"))
	}
	if err := s.LogLevel.UnmarshalText([]byte(v.String("log-level"))); err != nil {
		errs = append(errs, fmt.Errorf("log-level: %w", err))
	}
	if s.LogFormat != "json" && s.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("log-format: %q is neither json nor text", s.LogFormat))
	}
	if s.Profiles == "" {
		errs = append(errs, errors.New("profiles: a profiles file is required (--profiles or POOLD_PROFILES)"))
	}
	if s.QueueBodyBudget <= 0 {
		errs = append(errs, fmt.Errorf("queue-body-budget: must be positive, not %d", s.QueueBodyBudget))
	}
	if s.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("max-body-bytes: must be positive, not %d", s.MaxBodyBytes))
	}
	if s.MaxEventBytes <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive, not %d", openai.MaxEventSetting, s.MaxEventBytes))
	}
	if s.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown-timeout: must not be negative"))
	}
	return s, errors.Join(errs...)
}

// adminToken is the admin token given inline or in a file (its first line,
// trimmed), or "" when neither is given.
func adminToken(inline, file string) (string, error) {
	switch {
	case inline != "" && file != "":
		return "", errors.New("admin-token and admin-token-file: give one, not both")
	case file == "":
		return inline, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("admin-token-file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if tok := strings.TrimSpace(line); tok != "" {
		return tok, nil
	}
	return "", fmt.Errorf("admin-token-file: %q holds no token", file)
}

// openAccessLog opens the access log's destination; close is a no-op for
// stdout and stderr.
func openAccessLog(dest string) (w io.Writer, close func() error, err error) {
	switch dest {
	case "stdout":
		return os.Stdout, func() error { return nil }, nil
	case "stderr":
		return os.Stderr, func() error { return nil }, nil
	}
	f, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, nil, fmt.Errorf("opening access log: %w", err)
	}
	return f, f.Close, nil
}

// newLogger builds the daemon's logger on stderr.
func newLogger(s settings) *slog.Logger {
	return slog.New(logHandler(os.Stderr, s.LogFormat, s.LogLevel))
}
