package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// A Host is what the checks of a profile against the machine that would run
// its engine look up there. A nil function skips the checks that need it.
type Host struct {
	// LookPath resolves an engine binary as exec.LookPath does.
	LookPath func(file string) (string, error)
	// Stat describes a file as os.Stat does.
	Stat func(name string) (fs.FileInfo, error)
}

// removedFlags are `vllm serve` flags that current vLLM no longer accepts
// (given one, it exits at argument parsing), each with what to do instead,
// grouped by the release that dropped them.
var removedFlags = map[string]string{
	// v0.13
	"--task":                                    "use --runner pooling, or nothing: vLLM detects pooling models",
	"--cuda-graph-sizes":                        "use --cudagraph-capture-sizes",
	"--disable-mm-preprocessor-cache":           "use --mm-processor-cache-gb 0",
	"--enable-multimodal-encoder-data-parallel": "use --mm-encoder-tp-mode data",
	// v0.12
	"--guided-decoding-backend":                       "use --structured-outputs-config",
	"--guided-decoding-disable-fallback":              "use --structured-outputs-config",
	"--guided-decoding-disable-any-whitespace":        "use --structured-outputs-config",
	"--guided-decoding-disable-additional-properties": "use --structured-outputs-config",
	"--num-redundant-experts":                         "use --eplb-config",
	"--eplb-window-size":                              "use --eplb-config",
	"--eplb-step-interval":                            "use --eplb-config",
	"--eplb-log-balancedness":                         "use --eplb-config",
	// v0.11 and earlier (the V0 engine's)
	"--speculative-model":           "use --speculative-config",
	"--num-speculative-tokens":      "use --speculative-config",
	"--device":                      "drop it: vLLM detects the platform, and CUDA_VISIBLE_DEVICES picks the GPUs",
	"--num-scheduler-steps":         "drop it: multi-step scheduling is gone",
	"--multi-step-stream-outputs":   "drop it: multi-step scheduling is gone",
	"--enable-prompt-adapter":       "drop it: prompt adapters are gone",
	"--max-prompt-adapters":         "drop it: prompt adapters are gone",
	"--max-prompt-adapter-token":    "drop it: prompt adapters are gone",
	"--tokenizer-pool-size":         "drop it: tokenizer pools are gone",
	"--tokenizer-pool-type":         "drop it: tokenizer pools are gone",
	"--tokenizer-pool-extra-config": "drop it: tokenizer pools are gone",
	"--use-v2-block-manager":        "drop it",
	"--preemption-mode":             "drop it",
	"--scheduler-delay-factor":      "drop it",
	"--disable-async-output-proc":   "drop it",
	"--max-seq-len-to-capture":      "drop it",
	"--override-neuron-config":      "drop it: Neuron support is gone",
}

// Preflight returns what would make p's engine fail to start on h, started
// by l, although p is valid: a flag that vLLM has removed, an engine binary
// that does not resolve (Command[0] with {poold} replaced, or the first word
// of l's launcher, the vllm-command setting), a local model path (absolute,
// or relative from ./ or ../) that does not exist, when the engine is given
// it (the launcher, or {model} in Command). Each error names its field as a
// JSON path within the profile, or the setting.
func (p *Profile) Preflight(h Host, l Launch) []error {
	var errs []error
	field, args := "args", p.Args
	if p.Command != nil {
		field, args = "command", p.Command
	}
	for i, a := range args {
		if flag, hint := removedFlag(a); hint != "" {
			errs = append(errs, fmt.Errorf("%s[%d]: vLLM no longer accepts %s; %s", field, i, flag, hint))
		}
	}
	if h.LookPath != nil {
		bin := l.vllm()[0]
		where := fmt.Sprintf("engine binary %q (the vllm-command setting)", bin)
		if p.Command != nil {
			bin = strings.ReplaceAll(p.Command[0], "{poold}", l.Self)
			where = fmt.Sprintf("command[0]: engine binary %q", bin)
		}
		if _, err := h.LookPath(bin); err != nil {
			errs = append(errs, fmt.Errorf("%s does not resolve on this host: %w", where, err))
		}
	}
	if h.Stat != nil && isLocalPath(p.Model) && p.passesModel() {
		if _, err := h.Stat(p.Model); errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("model %q: no such file or directory on this host", p.Model))
		} else if err != nil {
			errs = append(errs, fmt.Errorf("model %q: %w", p.Model, err))
		}
	}
	return errs
}

// Warnings returns the Preflight problems of every profile, what would fail
// on h, started by l, in a valid file, and what its engine would do that
// costs its requests (IdleSleep), each prefixed with the profile's JSON
// path.
func (c *Config) Warnings(h Host, l Launch) []error {
	var out []error
	for i, p := range c.Profiles {
		errs := p.Preflight(h, l)
		if err := p.IdleSleep(); err != nil {
			errs = append(errs, err)
		}
		for _, err := range errs {
			out = append(out, fmt.Errorf("%s: %w", elem("profiles", i, p.ID), err))
		}
	}
	return out
}

// idleSleepFlags are the engine flags that make an engine sleep by itself
// once idle. The newest vLLM servers can; the spelling of their option
// could not be confirmed, so only the simulator's is known here.
var idleSleepFlags = []string{"--sim-idle-sleep"}

// IdleSleep returns a warning, naming its field, when p's engine is told to
// sleep by itself once idle (idleSleepFlags, a word of an argument, so
// that a command run through a shell is read too), and nil otherwise. Such
// an engine still serves: poold notices it in the engine's metrics and
// wakes it before the next request, which waits for the wake. It is no
// reason to refuse a start, so Preflight does not return it.
func (p *Profile) IdleSleep() error {
	field, args := "args", p.Args
	if p.Command != nil {
		field, args = "command", p.Command
	}
	for i, a := range args {
		for _, w := range strings.Fields(a) {
			flag, _, _ := strings.Cut(w, "=")
			if slices.Contains(idleSleepFlags, flag) {
				return fmt.Errorf("%s[%d]: %s makes the engine sleep by itself once idle: poold notices it in the engine's metrics (engine-metrics-interval; 0 leaves it unnoticed) and wakes it itself, so the first request after each such sleep waits for the wake (a level-1 wake takes seconds, level 2 reloads the weights); "+
					"sleep.level with idleTimeout puts it to sleep on poold's schedule instead, one that poold accounts for in its sleeper limits and /status", field, i, flag)
			}
		}
	}
	return nil
}

// removedFlag returns the flag that arg gives ("--task" for "--task=embed"
// or "--task") and, when vLLM has removed it, what replaced it. vLLM reads
// underscores in flag names as dashes.
func removedFlag(arg string) (flag, hint string) {
	if !strings.HasPrefix(arg, "--") {
		return "", ""
	}
	flag, _, _ = strings.Cut(arg, "=")
	flag = "--" + strings.ReplaceAll(flag[2:], "_", "-")
	return flag, removedFlags[flag]
}

// isLocalPath reports whether model names a local path rather than a
// model on a hub: absolute, or relative from ./ or ../.
func isLocalPath(model string) bool {
	return strings.HasPrefix(model, "/") || strings.HasPrefix(model, "./") || strings.HasPrefix(model, "../")
}

// passesModel reports whether p's engine is given its model: the launcher
// gives it, a Command only through {model}.
func (p *Profile) passesModel() bool {
	if p.Command == nil {
		return true
	}
	for _, a := range p.Command {
		if strings.Contains(a, "{model}") {
			return true
		}
	}
	return false
}
