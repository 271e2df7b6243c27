package enginesim

import (
	"errors"
	"fmt"
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

// Config is the parsed command line of `poold engine-sim`. It mirrors the subset of
// `vllm serve` flags poold passes, plus --sim-* flags that shape the simulation.
// The zero value is not useful: use ParseFlags, which applies the defaults below.
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

	// Accepted for compatibility with `vllm serve`, otherwise ignored.
	TensorParallelSize   int
	GPUMemoryUtilization float64
	EnablePrefixCaching  bool
	Dtype                string
	ShutdownTimeout      int
	// EnableSleepMode, with DevMode, serves vLLM's sleep endpoints (sleep.go).
	EnableSleepMode bool
	// DevMode is VLLM_SERVER_DEV_MODE=1 in the environment (read by Main):
	// without it the development endpoints, sleep mode's among them, are not
	// served (404), as in vLLM.
	DevMode bool

	// MaxNumSeqs, as vLLM's --max-num-seqs, bounds the requests generating at
	// once; the others wait their turn (vllm:num_requests_waiting), so that an
	// overloaded engine answers later. Zero means no bound.
	MaxNumSeqs int

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
			return fmt.Errorf("invalid int value %q", v)
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
	"model": {kindString, func(c *Config, v string) error { c.Model = v; return nil }, "model name or path (same as the positional MODEL)"},
	"host":  {kindString, func(c *Config, v string) error { c.Host = v; return nil }, "listen host (default 127.0.0.1)"},
	"port":  {kindInt, intFlag(func(c *Config) *int { return &c.Port }, 0), "listen port (default 8000; 0 picks one)"},
	"served-model-name": {kindNames, func(c *Config, v string) error {
		c.ServedModelNames = append(c.ServedModelNames, v)
		return nil
	}, "one or more names clients may use (default: MODEL)"},
	"max-model-len":        {kindInt, intFlag(func(c *Config) *int { return &c.MaxModelLen }, 1), "context length (default 4096)"},
	"tensor-parallel-size": {kindInt, intFlag(func(c *Config) *int { return &c.TensorParallelSize }, 1), "ignored"},
	"gpu-memory-utilization": {kindFloat, func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		c.GPUMemoryUtilization = f
		return err
	}, "ignored"},
	"enable-prefix-caching": {kindBool, boolFlag(func(c *Config) *bool { return &c.EnablePrefixCaching }), "ignored"},
	"dtype":                 {kindString, func(c *Config, v string) error { c.Dtype = v; return nil }, "ignored"},
	"shutdown-timeout":      {kindInt, intFlag(func(c *Config) *int { return &c.ShutdownTimeout }, 0), "ignored"},
	"enable-sleep-mode":     {kindBool, boolFlag(func(c *Config) *bool { return &c.EnableSleepMode }), "serve /sleep, /wake_up, /is_sleeping… (needs env VLLM_SERVER_DEV_MODE=1)"},
	"max-num-seqs":          {kindInt, intFlag(func(c *Config) *int { return &c.MaxNumSeqs }, 1), "requests generating at once; the others wait (default: no bound)"},

	"sim-load-delay":         {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.LoadDelay }), "load time before listening (default 0)"},
	"sim-ttft":               {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.TTFT }), "time to first token (default 0)"},
	"sim-itl":                {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ITL }), "inter-token delay (default 0)"},
	"sim-tokens":             {kindInt, intFlag(func(c *Config) *int { return &c.Tokens }, 1), "completion tokens without max_tokens (default 16)"},
	"sim-wake-delay":         {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.WakeDelay }), "time a /wake_up takes (default 0)"},
	"sim-refuse-wake":        {kindBool, boolFlag(func(c *Config) *bool { return &c.RefuseWake }), "fail every /wake_up with 500"},
	"sim-fail-load":          {kindBool, boolFlag(func(c *Config) *bool { return &c.FailLoad }), "fail loading: log an error and exit 1"},
	"sim-never-ready":        {kindBool, boolFlag(func(c *Config) *bool { return &c.NeverReady }), "never listen"},
	"sim-hang":               {kindBool, boolFlag(func(c *Config) *bool { return &c.Hang }), "listen but never answer"},
	"sim-hang-requests":      {kindBool, boolFlag(func(c *Config) *bool { return &c.HangRequests }), "become ready, but never answer POST requests"},
	"sim-fail-requests":      {kindBool, boolFlag(func(c *Config) *bool { return &c.FailRequests }), "become ready, but answer every POST request with 500"},
	"sim-log-headers":        {kindBool, boolFlag(func(c *Config) *bool { return &c.LogHeaders }), "log the names of each request's headers"},
	"sim-crash-after-tokens": {kindInt, intFlag(func(c *Config) *int { return &c.CrashAfterTokens }, 0), "SIGKILL self after N content tokens in total"},
	"sim-exit-after-ready":   {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ExitAfterReady }), "exit 1 this long after ready"},
	"sim-ignore-sigterm":     {kindBool, boolFlag(func(c *Config) *bool { return &c.IgnoreSigterm }), "log and ignore SIGTERM/SIGINT"},
	"sim-spawn-child":        {kindBool, boolFlag(func(c *Config) *bool { return &c.SpawnChild }), "spawn a VLLM::EngineCore child that ignores SIGTERM"},
	"sim-child":              {kindBool, boolFlag(func(c *Config) *bool { return &c.Child }), "internal: run as the spawned child"},
	"sim-child-lifetime":     {kindDuration, durFlag(func(c *Config) *time.Duration { return &c.ChildLifetime }), "the child exits by itself after this (default 10m)"},
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
	return b.String()
}

// ParseFlags parses `vllm serve`-style arguments: an optional positional MODEL,
// `--flag value` or `--flag=value` (underscores in names are accepted as dashes),
// boolean flags without a value (and their --no-X forms), and --served-model-name
// taking one or more following values (argparse nargs='+'). Unknown flags, missing
// values and a second positional argument are errors; -h/--help returns ErrHelp.
func ParseFlags(args []string) (Config, error) {
	cfg := Config{
		Host:          "127.0.0.1",
		Port:          8000,
		MaxModelLen:   4096,
		Tokens:        16,
		ChildLifetime: 10 * time.Minute,
	}
	positional := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "--help" {
			return Config{}, ErrHelp
		}
		if !strings.HasPrefix(a, "--") || a == "--" {
			if a == "--" || (strings.HasPrefix(a, "-") && len(a) > 1 && !isNumber(a)) {
				return Config{}, fmt.Errorf("unrecognized arguments: %s", a)
			}
			if positional != "" {
				return Config{}, fmt.Errorf("unrecognized arguments: %s", a)
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
			return Config{}, fmt.Errorf("unrecognized arguments: %s", a)
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
