package enginesim

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultModel is the model served when no positional MODEL (or --model) is given,
// as `vllm serve` does with no model argument.
const DefaultModel = "Qwen/Qwen3-0.6B"

// ErrHelp is returned by ParseFlags when -h or --help was given.
var ErrHelp = errors.New("help requested")

// Config is the parsed command line of `poold engine-sim` (and, for the fields
// marked so, its environment). It mirrors the subset of `vllm serve` flags poold
// passes, plus --sim-* flags that shape the simulation. The zero value is not
// useful: use ParseFlags, which applies the defaults below, and ReadEnv.
type Config struct {
	// Model is the positional MODEL (or --model); DefaultModel when absent. It is the
	// "root" of every /v1/models entry.
	Model string
	// Host is the listen address; default 127.0.0.1.
	Host string
	// Port is the listen port; default 8000. Zero picks a free port (logged in the
	// "ready" line).
	Port int
	// ServedModelNames are the names clients may use; default []string{Model}. The
	// first one labels metrics and is the "model" of every response, as in vLLM.
	ServedModelNames []string
	// MaxModelLen bounds prompt+completion tokens; default 4096.
	MaxModelLen int
	// Runner is --runner: "auto" (the default), "generate", "pooling" or "draft".
	// With Convert it decides what the model serves (see kind).
	Runner string
	// Convert is --convert: "auto" (the default), "none", "embed", "classify" or
	// "reward"; the last three make a pooling model.
	Convert string
	// GPUMemoryUtilization is the share of each GPU's memory the engine takes;
	// default 0.9. With SimGPUDir, start-up needs that much free (memory.go).
	GPUMemoryUtilization float64
	// EnablePrefixCaching turns the simulated prefix cache on (the default, as
	// in vLLM's V1 engine); --no-enable-prefix-caching turns it off.
	EnablePrefixCaching bool

	// Accepted for compatibility with `vllm serve`, otherwise ignored.
	TensorParallelSize int
	Dtype              string

	// ShutdownTimeout is --shutdown-timeout, in seconds: after SIGTERM the
	// server refuses new requests (503) and lets those in flight run on
	// this long before it aborts them. Zero, vLLM's default, aborts them at
	// once.
	ShutdownTimeout int

	// EnableSleepMode, with DevMode, serves vLLM's sleep endpoints (sleep.go).
	EnableSleepMode bool
	// IdleSleep, when positive, puts the engine to sleep by itself once no
	// request has been in flight for that long, at IdleSleepLevel (1, the
	// default, or 2); the next request wakes it. It stands in for the idle
	// sleep of the newest vLLM servers, whose flags the simulator does not
	// claim to know, and needs EnableSleepMode. Zero never sleeps idle.
	IdleSleep      time.Duration
	IdleSleepLevel int
	// EnableAutoToolChoice and ToolCallParser allow tool_choice "auto", as in vLLM.
	EnableAutoToolChoice bool
	ToolCallParser       string
	// EnableRequestIDHeaders adds X-Request-Id to every response.
	EnableRequestIDHeaders bool
	// EnableLogRequests logs every generation request with its whole prompt.
	EnableLogRequests bool
	// EnableForceIncludeUsage is --enable-force-include-usage: every stream
	// of chat or completions carries usage in each chunk and ends with the
	// usage chunk, whatever its stream_options say.
	EnableForceIncludeUsage bool
	// DisableAccessLog is --disable-uvicorn-access-log: no access log line
	// (access.go); AccessLogSkip, --disable-access-log-for-endpoints, lists
	// the paths whose requests get none.
	DisableAccessLog bool
	AccessLogSkip    []string

	// MaxNumSeqs, as vLLM's --max-num-seqs, bounds the requests generating at
	// once; the others wait their turn (vllm:num_requests_waiting), so that an
	// overloaded engine answers later. Zero means no bound.
	MaxNumSeqs int

	// Read from the environment by ReadEnv, as vLLM reads them.

	// DevMode is VLLM_SERVER_DEV_MODE, an integer, non-zero: without it the
	// development endpoints, sleep mode's among them, are not served (404).
	DevMode bool
	// APIKey is VLLM_API_KEY: when not empty, every /v1 request must bear it.
	APIKey string
	// KeepAliveOnEngineDeath is VLLM_KEEP_ALIVE_ON_ENGINE_DEATH set (not empty):
	// a dead engine core does not end the server.
	KeepAliveOnEngineDeath bool
	// KeepAlive is VLLM_HTTP_TIMEOUT_KEEP_ALIVE: how long an idle client
	// connection stays open. Zero means vLLM's default, 5 s.
	KeepAlive time.Duration
	// VisibleDevices is CUDA_VISIBLE_DEVICES: the GPUs whose simulated memory
	// the engine uses (with SimGPUDir). Nil means GPU 0.
	VisibleDevices []int

	// LoadDelay is how long the simulated engine loads before the server listens;
	// connections are refused meanwhile. Zero listens at once.
	LoadDelay time.Duration
	// TTFT is the delay before the first generated token; zero means none.
	TTFT time.Duration
	// ITL is the delay between consecutive tokens; zero means none.
	ITL time.Duration
	// Tokens is the completion length when a request sets no max_tokens; default 16.
	Tokens int
	// WakeDelay is how long POST /wake_up takes, and half of LoadDelay how long
	// reload_weights takes after a level-2 sleep; zero means at once.
	WakeDelay time.Duration
	// RefuseWake makes POST /wake_up fail with 500 (a wake that fails).
	RefuseWake bool
	// KVCapacityTokens is the simulated KV cache's size in tokens; zero means
	// MaxModelLen × MaxNumSeqs (256 when MaxNumSeqs is unbounded).
	KVCapacityTokens int

	// SimGPUDir is a simulated-GPU directory (package simgpu) whose memory the
	// engine claims as vLLM does on real GPUs; empty means none (memory.go).
	SimGPUDir string
	// SleepResidueMiB is the memory a sleeping engine keeps on each GPU, in MiB;
	// default 512.
	SleepResidueMiB int

	// PortMessage is how a taken port is reported: "old" (the default,
	// Python's "[Errno 98] Address already in use"), "new" (newer vLLM's
	// "Port N is already in use") or "go" (a Go engine's "listen tcp …: bind:
	// address already in use").
	PortMessage string
	// ReusePort binds with SO_REUSEPORT, so that two engines can share a port.
	ReusePort bool
	// UsageNull puts "usage": null in every stream chunk but the usage chunk,
	// as older vLLM versions do; by default those chunks have no usage key.
	UsageNull bool
	// SSENewline is the line ending of server-sent events: "lf" (the
	// default), "cr" or "crlf".
	SSENewline string
	// CutBody makes every successful non-streaming inference answer promise
	// its whole Content-Length and close the connection halfway.
	CutBody bool
	// CleanPaths cleans dot-segments from the decoded path before routing, as
	// some permissive engines do ("/v1/../sleep" reaches "/sleep").
	CleanPaths bool
	// LogLineBytes, when positive, prints one start-up line that long.
	LogLineBytes int

	// FailLoad makes Run fail with ErrLoadFailed after LoadDelay.
	FailLoad bool
	// NeverReady makes Run wait for termination without ever listening.
	NeverReady bool
	// Hang makes every handler block until the request or the process ends.
	Hang bool
	// HangRequests makes the API's POST endpoints block until the request or the
	// process ends, while /v1/models and /health answer (a ready engine that hangs).
	HangRequests bool
	// FailRequests makes the API's POST endpoints answer 500 at once, while
	// /v1/models and /health answer (a ready engine whose requests all fail).
	FailRequests bool
	// LogHeaders logs the names (never the values) of every request's headers.
	LogHeaders bool
	// CrashAfterTokens, when positive, SIGKILLs the process once that many content
	// tokens have been sent in total; zero disables it.
	CrashAfterTokens int
	// ExitAfterReady, when positive, makes Run return ErrExitAfterReady that long
	// after the server started listening; zero disables it.
	ExitAfterReady time.Duration
	// CoreDiesAfter, when positive, kills the simulated engine core that long
	// after the server started listening (see Server.killCore); zero disables it.
	CoreDiesAfter time.Duration
	// DieOnFirstRequest makes the engine core die at the first inference
	// request it takes, as vLLM's CPU backend does with an attention head
	// size it has no kernel for: start-up and readiness pass, the first
	// request prints the reason and gets a 500, and Run exits at the
	// watchdog's next check (see Server.dieAtFirstRequest).
	DieOnFirstRequest bool
	// WatchdogInterval is how often the server checks for a dead engine core
	// and exits; default 5 s, vLLM's.
	WatchdogInterval time.Duration
	// IgnoreSigterm makes Main log and ignore SIGTERM and SIGINT.
	IgnoreSigterm bool
	// SpawnChild makes Run start a "VLLM::EngineCore" child in the same process group
	// that ignores SIGTERM and survives its parent (for ChildLifetime).
	SpawnChild bool
	// Child runs this process as that child (set by the parent; not for users).
	Child bool
	// ChildLifetime is how long a child lives before it exits by itself; default 10m.
	ChildLifetime time.Duration

	// reexecArgs are the arguments between the executable and the engine-sim flags
	// that re-run engine-sim (for the child); nil means {"engine-sim"}.
	reexecArgs []string
}

// modelKind is what a model serves.
type modelKind int

const (
	generative    modelKind = iota // chat and completions
	pooling                        // embeddings, score, rerank, classify, pooling
	transcription                  // audio transcriptions and translations
)

func (k modelKind) String() string {
	return [...]string{"generate", "pooling", "transcription"}[k]
}

// kind decides what the model serves, standing in for vLLM's reading of the
// model's architecture. --runner pooling, or --convert embed, classify or
// reward, makes a pooling model. Otherwise the model's name decides (its last
// path element, lower-cased): one containing "whisper" is a transcription
// model; with --runner auto, one containing "embed" or "rerank", or with a
// word (between '-', '_' or '.') "bge", "e5" or "gte", is a pooling model;
// anything else is generative.
func (c Config) kind() modelKind {
	switch {
	case c.Runner == "pooling" || c.Convert == "embed" || c.Convert == "classify" || c.Convert == "reward":
		return pooling
	}
	name := strings.ToLower(path.Base(c.Model))
	if strings.Contains(name, "whisper") {
		return transcription
	}
	if c.Runner != "auto" && c.Runner != "" {
		return generative
	}
	if strings.Contains(name, "embed") || strings.Contains(name, "rerank") {
		return pooling
	}
	words := strings.FieldsFunc(name, func(r rune) bool { return r == '-' || r == '_' || r == '.' })
	if slices.ContainsFunc(words, func(w string) bool { return w == "bge" || w == "e5" || w == "gte" }) {
		return pooling
	}
	return generative
}

type flagKind int

const (
	kindString flagKind = iota
	kindInt
	kindFloat
	kindBool
	kindDuration
	kindNames
)

type flagSpec struct {
	kind flagKind
	set  func(c *Config, v string) error
	help string
}

func intFlag(dst func(*Config) *int, min int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("invalid int value: '%s'", v)
		}
		if n < min {
			return fmt.Errorf("value %d must be at least %d", n, min)
		}
		*dst(c) = n
		return nil
	}
}

func durFlag(dst func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		*dst(c) = d
		return nil
	}
}

func boolFlag(dst func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("invalid bool value %q", v)
		}
		*dst(c) = b
		return nil
	}
}

func stringFlag(dst func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

// choiceFlag accepts one of choices, with argparse's message otherwise.
func choiceFlag(dst func(*Config) *string, choices ...string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if !slices.Contains(choices, v) {
			return fmt.Errorf("invalid choice: '%s' (choose from '%s')", v, strings.Join(choices, "', '"))
		}
		*dst(c) = v
		return nil
	}
}

// ignored accepts any value of a `vllm serve` flag the simulator does not model.
func ignored(*Config, string) error { return nil }

// parseDuration accepts a Go duration ("1.5s", "200ms") or plain seconds ("2", "0.5").
func parseDuration(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 {
			return 0, fmt.Errorf("negative duration %q", v)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 500ms, 2s or 1.5)", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", v)
	}
	return d, nil
}

var flagSpecs = map[string]flagSpec{
	"model": {kindString, stringFlag(func(c *Config) *string { return &c.Model }), "model name or path (same as the positional MODEL)"},
	"host":  {kindString, stringFlag(func(c *Config) *string { return &c.Host }), "listen host (default 127.0.0.1)"},
	"port":  {kindInt, intFlag(func(c *Config) *int { return &c.Port }, 0), "listen port (default 8000; 0 picks one)"},
	"served-model-name": {kindNames, func(c *Config, v string) error {
		c.ServedModelNames = append(c.ServedModelNames, v)
		return nil
	}, "one or more names clients may use (default: MODEL)"},
	"max-model-len":        {kindInt, intFlag(func(c *Config) *int { return &c.MaxModelLen }, 1), "context length (default 4096)"},
	"runner":               {kindString, choiceFlag(func(c *Config) *string { return &c.Runner }, "auto", "generate", "pooling", "draft"), "auto (default: decided from the model name), generate, pooling or draft"},
	"convert":              {kindString, choiceFlag(func(c *Config) *string { return &c.Convert }, "auto", "none", "embed", "classify", "reward"), "auto (default), none, embed, classify or reward (the last three: a pooling model)"},
	"tensor-parallel-size": {kindInt, intFlag(func(c *Config) *int { return &c.TensorParallelSize }, 1), "ignored"},
	"gpu-memory-utilization": {kindFloat, func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("invalid float value: '%s'", v)
		}
		if f <= 0 || f > 1 {
			return fmt.Errorf("value %s must be in (0, 1]", v)
		}
		c.GPUMemoryUtilization = f
		return nil
	}, "share of each GPU's memory to take (default 0.9; checked against --sim-gpu-dir)"},
	"enable-prefix-caching":     {kindBool, boolFlag(func(c *Config) *bool { return &c.EnablePrefixCaching }), "simulated prefix cache (default on; --no-enable-prefix-caching)"},
	"dtype":                     {kindString, stringFlag(func(c *Config) *string { return &c.Dtype }), "ignored"},
	"shutdown-timeout":          {kindInt, intFlag(func(c *Config) *int { return &c.ShutdownTimeout }, 0), "seconds in-flight requests may run on after SIGTERM, new ones refused 503 (default 0: abort at once)"},
	"quantization":              {kindString, ignored, "ignored"},
	"kv-cache-dtype":            {kindString, ignored, "ignored"},
	"max-num-batched-tokens":    {kindInt, ignored, "ignored"},
	"trust-remote-code":         {kindBool, ignored, "ignored"},
	"enforce-eager":             {kindBool, ignored, "ignored"},
	"disable-log-stats":         {kindBool, ignored, "ignored"},
	"enable-sleep-mode":         {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableSleepMode }), "serve /sleep, /wake_up, /is_sleeping… (needs env VLLM_SERVER_DEV_MODE=1)"},
	"enable-auto-tool-choice":   {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableAutoToolChoice }), "allow tool_choice \"auto\" (with --tool-call-parser)"},
	"tool-call-parser":          {kindString, stringFlag(func(c *Config) *string { return &c.ToolCallParser }), "any name: allows tool_choice \"auto\" (with --enable-auto-tool-choice)"},
	"enable-request-id-headers": {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableRequestIDHeaders }), "add X-Request-Id to every response"},
	"enable-log-requests":       {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableLogRequests }), "log every request with its whole prompt, on one line"},
	"max-num-seqs":              {kindInt, intFlag(func(c *Config) *int { return &c.MaxNumSeqs }, 1), "requests generating at once; the others wait (default: no bound)"},

	"enable-force-include-usage": {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableForceIncludeUsage }), "usage in every stream chunk and a final usage chunk, whatever stream_options say"},

	"disable-uvicorn-access-log": {kindBool, boolFlag(func(c *Config) *bool { return &c.DisableAccessLog }), "print no access log line"},
	"disable-access-log-for-endpoints": {kindString, func(c *Config, v string) error {
		c.AccessLogSkip = nil
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.AccessLogSkip = append(c.AccessLogSkip, p)
			}
		}
		return nil
	}, "comma-separated paths whose requests get no access log line (/health,/metrics)"},

	"sim-load-delay":         {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.LoadDelay }), "load time before listening (default 0)"},
	"sim-ttft":               {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.TTFT }), "time to first token (default 0)"},
	"sim-itl":                {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ITL }), "inter-token delay (default 0)"},
	"sim-tokens":             {kindInt, intFlag(func(c *Config) *int { return &c.Tokens }, 1), "completion tokens without max_tokens (default 16)"},
	"sim-wake-delay":         {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.WakeDelay }), "time a /wake_up takes (default 0)"},
	"sim-refuse-wake":        {kindBool, boolFlag(func(c *Config) *bool { return &c.RefuseWake }), "fail every /wake_up with 500"},
	"sim-kv-capacity-tokens": {kindInt, intFlag(func(c *Config) *int { return &c.KVCapacityTokens }, 1), "KV cache size in tokens (default max-model-len × max-num-seqs, 256 seqs when unbounded)"},
	"sim-gpu-dir":            {kindString, stringFlag(func(c *Config) *string { return &c.SimGPUDir }), "simulated-GPU directory to claim memory in, as vLLM does on GPUs"},
	"sim-sleep-residue-mib":  {kindInt, intFlag(func(c *Config) *int { return &c.SleepResidueMiB }, 0), "memory a sleeping engine keeps per GPU, in MiB (default 512)"},
	"sim-port-message":       {kindString, choiceFlag(func(c *Config) *string { return &c.PortMessage }, "old", "new", "go"), "how a taken port is reported: old ([Errno 98], the default), new (Port N is already in use) or go (bind: address already in use)"},
	"sim-reuseport":          {kindBool, boolFlag(func(c *Config) *bool { return &c.ReusePort }), "bind with SO_REUSEPORT (two engines can share a port)"},
	"sim-usage-null":         {kindBool, boolFlag(func(c *Config) *bool { return &c.UsageNull }), "stream chunks carry \"usage\": null (older vLLM)"},
	"sim-sse-newline":        {kindString, choiceFlag(func(c *Config) *string { return &c.SSENewline }, "lf", "cr", "crlf"), "SSE line ending: lf (default), cr or crlf"},
	"sim-cut-body":           {kindBool, boolFlag(func(c *Config) *bool { return &c.CutBody }), "non-streaming answers promise a Content-Length and close halfway"},
	"sim-clean-paths":        {kindBool, boolFlag(func(c *Config) *bool { return &c.CleanPaths }), "clean dot-segments from the path before routing"},
	"sim-log-line-bytes":     {kindInt, intFlag(func(c *Config) *int { return &c.LogLineBytes }, 0), "print one start-up line of N characters"},
	"sim-fail-load":          {kindBool, boolFlag(func(c *Config) *bool { return &c.FailLoad }), "fail loading: log an error and exit 1"},
	"sim-never-ready":        {kindBool, boolFlag(func(c *Config) *bool { return &c.NeverReady }), "never listen"},
	"sim-hang":               {kindBool, boolFlag(func(c *Config) *bool { return &c.Hang }), "listen but never answer"},
	"sim-hang-requests":      {kindBool, boolFlag(func(c *Config) *bool { return &c.HangRequests }), "become ready, but never answer POST requests"},
	"sim-fail-requests":      {kindBool, boolFlag(func(c *Config) *bool { return &c.FailRequests }), "become ready, but answer every POST request with 500"},
	"sim-log-headers":        {kindBool, boolFlag(func(c *Config) *bool { return &c.LogHeaders }), "log the names of each request's headers"},
	"sim-crash-after-tokens": {kindInt, intFlag(func(c *Config) *int { return &c.CrashAfterTokens }, 0), "SIGKILL self after N content tokens in total"},
	"sim-exit-after-ready":   {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ExitAfterReady }), "exit 1 this long after ready"},
	"sim-ignore-sigterm":     {kindBool, boolFlag(func(c *Config) *bool { return &c.IgnoreSigterm }), "log and ignore SIGTERM/SIGINT"},
	"sim-spawn-child":        {kindBool, boolFlag(func(c *Config) *bool { return &c.SpawnChild }), "spawn a VLLM::EngineCore child that ignores SIGTERM (and holds the simulated GPU memory)"},
	"sim-child":              {kindBool, boolFlag(func(c *Config) *bool { return &c.Child }), "internal: run as the spawned child"},
	"sim-child-lifetime":     {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ChildLifetime }), "the child exits by itself after this (default 10m)"},

	// Idle sleep, as the newest vLLM servers can do by themselves.
	"sim-idle-sleep":       {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.IdleSleep }), "sleep by itself after this long without a request in flight (needs --enable-sleep-mode; default 0: never); the next request wakes it"},
	"sim-idle-sleep-level": {kindInt, intFlag(func(c *Config) *int { return &c.IdleSleepLevel }, 1), "the level of --sim-idle-sleep: 1 (default) or 2"},

	// The engine core's death, and the watchdog that ends the server then.
	"sim-core-dies-after":      {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.CoreDiesAfter }), "the engine core dies this long after ready: /health 503, inference 500, exit at the watchdog"},
	"sim-die-on-first-request": {kindBool, boolFlag(func(c *Config) *bool { return &c.DieOnFirstRequest }), "become ready, then die at the first inference request: print the reason (an unsupported CPU attention head size), answer it 500, exit at the watchdog"},
	"sim-watchdog-interval":    {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.WatchdogInterval }), "how often a dead engine core is noticed and the server exits (default 5s)"},
}

// Usage returns the help text for engine-sim.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: poold engine-sim [MODEL] [flags]\n\nSimulates `vllm serve MODEL` for tests and demos.\n\nflags (--flag value or --flag=value):\n")
	names := make([]string, 0, len(flagSpecs))
	for n := range flagSpecs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s := flagSpecs[n]
		arg := ""
		switch s.kind {
		case kindString:
			arg = " S"
		case kindInt:
			arg = " N"
		case kindFloat:
			arg = " F"
		case kindDuration:
			arg = " D"
		case kindNames:
			arg = " NAME [NAME ...]"
		}
		fmt.Fprintf(&b, "  --%s%s\n        %s\n", n, arg, s.help)
	}
	b.WriteString("\nenvironment: VLLM_SERVER_DEV_MODE, VLLM_API_KEY, VLLM_KEEP_ALIVE_ON_ENGINE_DEATH,\nVLLM_HTTP_TIMEOUT_KEEP_ALIVE, CUDA_VISIBLE_DEVICES (see the package documentation)\n")
	return b.String()
}

// ParseFlags parses `vllm serve`-style arguments: an optional positional MODEL,
// `--flag value` or `--flag=value` (underscores in names are accepted as dashes),
// boolean flags without a value (and their --no-X forms), and --served-model-name
// taking one or more following values (argparse nargs='+'). Unknown flags and a
// second positional argument are collected and reported together, as argparse
// does ("unrecognized arguments: --task embed"); a missing or bad value is an
// error; -h/--help returns ErrHelp.
func ParseFlags(args []string) (Config, error) {
	cfg := Config{
		Host:                 "127.0.0.1",
		Port:                 8000,
		MaxModelLen:          4096,
		Runner:               "auto",
		Convert:              "auto",
		GPUMemoryUtilization: 0.9,
		EnablePrefixCaching:  true,
		Tokens:               16,
		SleepResidueMiB:      512,
		IdleSleepLevel:       1,
		PortMessage:          "old",
		SSENewline:           "lf",
		WatchdogInterval:     5 * time.Second,
		ChildLifetime:        10 * time.Minute,
	}
	positional := ""
	var unrecognized []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "--help" {
			return Config{}, ErrHelp
		}
		if !strings.HasPrefix(a, "--") || a == "--" {
			if a == "--" || looksLikeFlag(a) || positional != "" {
				unrecognized = append(unrecognized, a)
				continue
			}
			positional = a
			continue
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		name = strings.ReplaceAll(name, "_", "-")
		spec, ok := flagSpecs[name]
		if !ok {
			// argparse.BooleanOptionalAction: --no-X turns X off.
			if base, isNo := strings.CutPrefix(name, "no-"); isNo && !hasValue {
				if s, ok := flagSpecs[base]; ok && s.kind == kindBool {
					if err := s.set(&cfg, "false"); err != nil {
						return Config{}, fmt.Errorf("argument --%s: %w", name, err)
					}
					continue
				}
			}
			unrecognized = append(unrecognized, a)
			continue
		}
		switch {
		case spec.kind == kindBool && !hasValue:
			value = "true"
		case spec.kind == kindNames:
			cfg.ServedModelNames = nil // a repeated flag replaces, as argparse does
			if hasValue {
				if err := spec.set(&cfg, value); err != nil {
					return Config{}, fmt.Errorf("argument --%s: %w", name, err)
				}
			}
			for i+1 < len(args) && !looksLikeFlag(args[i+1]) {
				i++
				if err := spec.set(&cfg, args[i]); err != nil {
					return Config{}, fmt.Errorf("argument --%s: %w", name, err)
				}
			}
			if len(cfg.ServedModelNames) == 0 {
				return Config{}, fmt.Errorf("argument --%s: expected at least one argument", name)
			}
			continue
		case !hasValue:
			if i+1 >= len(args) || looksLikeFlag(args[i+1]) {
				return Config{}, fmt.Errorf("argument --%s: expected one argument", name)
			}
			i++
			value = args[i]
		}
		if err := spec.set(&cfg, value); err != nil {
			return Config{}, fmt.Errorf("argument --%s: %w", name, err)
		}
	}
	if len(unrecognized) > 0 {
		return Config{}, fmt.Errorf("unrecognized arguments: %s", strings.Join(unrecognized, " "))
	}
	if positional != "" {
		if cfg.Model != "" && cfg.Model != positional {
			return Config{}, fmt.Errorf("model given twice: positional %q and --model %q", positional, cfg.Model)
		}
		cfg.Model = positional
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if len(cfg.ServedModelNames) == 0 {
		cfg.ServedModelNames = []string{cfg.Model}
	}
	for _, n := range cfg.ServedModelNames {
		if n == "" {
			return Config{}, errors.New("argument --served-model-name: empty name")
		}
	}
	if cfg.IdleSleepLevel > 2 {
		return Config{}, fmt.Errorf("argument --sim-idle-sleep-level: invalid choice: %d (choose from 1, 2)", cfg.IdleSleepLevel)
	}
	if cfg.IdleSleep > 0 && !cfg.EnableSleepMode {
		return Config{}, errors.New("--sim-idle-sleep needs --enable-sleep-mode")
	}
	if cfg.FailLoad && cfg.NeverReady {
		return Config{}, errors.New("--sim-fail-load and --sim-never-ready are exclusive")
	}
	return cfg, nil
}

// looksLikeFlag reports whether an argument is an option rather than a value, as
// argparse decides: a leading '-' that is not a negative number.
func looksLikeFlag(a string) bool {
	return strings.HasPrefix(a, "-") && len(a) > 1 && !isNumber(a)
}

func isNumber(a string) bool {
	_, err := strconv.ParseFloat(a, 64)
	return err == nil
}

// ReadEnv reads the environment variables vLLM reads into cfg, as vLLM
// parses them: VLLM_SERVER_DEV_MODE and VLLM_HTTP_TIMEOUT_KEEP_ALIVE are
// integers (anything else fails, as Python's int() does), VLLM_API_KEY a
// string, VLLM_KEEP_ALIVE_ON_ENGINE_DEATH on when not empty, and
// CUDA_VISIBLE_DEVICES a comma-separated list of GPU indexes.
func ReadEnv(cfg *Config, getenv func(string) string) error {
	pyInt := func(name, def string) (int, error) {
		v := getenv(name)
		if v == "" {
			v = def
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("%s: ValueError: invalid literal for int() with base 10: '%s'", name, v)
		}
		return n, nil
	}
	dev, err := pyInt("VLLM_SERVER_DEV_MODE", "0")
	if err != nil {
		return err
	}
	keepAlive, err := pyInt("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5")
	if err != nil {
		return err
	}
	cfg.DevMode = dev != 0
	cfg.KeepAlive = time.Duration(keepAlive) * time.Second
	cfg.APIKey = getenv("VLLM_API_KEY")
	cfg.KeepAliveOnEngineDeath = getenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH") != ""
	cfg.VisibleDevices = nil
	if v := getenv("CUDA_VISIBLE_DEVICES"); v != "" {
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("CUDA_VISIBLE_DEVICES=%s: %q is not a GPU index", v, f)
			}
			cfg.VisibleDevices = append(cfg.VisibleDevices, n)
		}
	}
	return nil
}
