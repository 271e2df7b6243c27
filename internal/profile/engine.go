package profile

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// DevModeEnv is the environment variable that makes vLLM serve its
// development endpoints, sleep mode's among them.
const DevModeEnv = "VLLM_SERVER_DEV_MODE"

// Argv returns the command line that serves p on 127.0.0.1:port on pool; self is
// this daemon's own executable.
//
// Without a Command it is
//
//	vllm serve <model> --host 127.0.0.1 --port <port> --served-model-name <id>
//		[--max-model-len N] [--tensor-parallel-size len(pool.GPUs)]
//		[--enable-sleep-mode] <args…>
//
// where --max-model-len is given when MaxModelLen is positive,
// --tensor-parallel-size when pool is not nil and Args do not set it (or -tp),
// and --enable-sleep-mode when Sleep is set and Args do not set it.
// With a Command, Args and MaxModelLen are unused and {port}, {model}, {id} and
// {poold} are replaced anywhere inside each argument of Command; a command
// with Sleep set must pass --enable-sleep-mode itself.
func (p *Profile) Argv(port int, pool *PoolSpec, self string) []string {
	portStr := strconv.Itoa(port)
	if p.Command != nil {
		r := strings.NewReplacer("{port}", portStr, "{model}", p.Model, "{id}", p.ID, "{poold}", self)
		argv := make([]string, len(p.Command))
		for i, a := range p.Command {
			argv[i] = r.Replace(a)
		}
		return argv
	}
	argv := []string{"vllm", "serve", p.Model, "--host", "127.0.0.1", "--port", portStr, "--served-model-name", p.ID}
	if p.MaxModelLen > 0 {
		argv = append(argv, "--max-model-len", strconv.Itoa(p.MaxModelLen))
	}
	if pool != nil && len(pool.GPUs) > 0 && !hasFlag(p.Args, "--tensor-parallel-size", "-tp") {
		argv = append(argv, "--tensor-parallel-size", strconv.Itoa(len(pool.GPUs)))
	}
	if p.Sleep != nil && !hasFlag(p.Args, "--enable-sleep-mode") {
		argv = append(argv, "--enable-sleep-mode")
	}
	return append(argv, p.Args...)
}

// hasFlag reports whether args set any of flags, as "-f v" or "-f=v".
func hasFlag(args []string, flags ...string) bool {
	for _, a := range args {
		for _, f := range flags {
			if a == f || strings.HasPrefix(a, f+"=") {
				return true
			}
		}
	}
	return false
}

// Environ returns p's environment as "KEY=value" pairs sorted by key, followed by
// CUDA_VISIBLE_DEVICES listing pool's GPUs (which replaces any in Env) when pool is
// not nil. With Sleep set, VLLM_SERVER_DEV_MODE=1 (which vLLM needs to serve its
// sleep endpoints) replaces any in Env. It is meant to be appended to os.Environ(),
// so that its values win.
func (p *Profile) Environ(pool *PoolSpec) []string {
	vars := p.Env
	if p.Sleep != nil {
		vars = maps.Clone(p.Env)
		if vars == nil {
			vars = make(map[string]string, 1)
		}
		vars[DevModeEnv] = "1"
	}
	env := make([]string, 0, len(vars)+1)
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if k == "CUDA_VISIBLE_DEVICES" && pool != nil {
			continue
		}
		env = append(env, k+"="+vars[k])
	}
	if pool != nil {
		gpus := make([]string, len(pool.GPUs))
		for i, g := range pool.GPUs {
			gpus[i] = strconv.Itoa(g)
		}
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(gpus, ","))
	}
	return env
}
