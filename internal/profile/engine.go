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

// DefaultVLLMCommand is the default of poold's vllm-command setting: the
// launcher of the engines of profiles with a model and no Command.
const DefaultVLLMCommand = "vllm serve"

// A Launch is what the command lines of a host's engines take from the poold
// that starts them.
type Launch struct {
	// Self is this poold's executable, which {poold} names in a Command.
	Self string
	// VLLM is the launcher of a profile with a model and no Command: poold's
	// vllm-command setting split into words, such as ["vllm", "serve"] or
	// ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"].
	// Empty means DefaultVLLMCommand.
	VLLM []string
}

// vllm is l's launcher, DefaultVLLMCommand when l names none.
func (l Launch) vllm() []string {
	if len(l.VLLM) == 0 {
		return strings.Fields(DefaultVLLMCommand)
	}
	return l.VLLM
}

// Argv returns the command line that serves p on 127.0.0.1:port on pool, as
// started by l.
//
// Without a Command it is
//
//	<l.VLLM…> --model <model> --host 127.0.0.1 --port <port> --served-model-name <id>
//		[--max-model-len N] [--tensor-parallel-size len(pool.GPUs)]
//		[--enable-sleep-mode] <args…>
//
// (by default `vllm serve --model <model> …`), where --max-model-len is given
// when MaxModelLen is positive, --tensor-parallel-size when pool is not nil
// and Args do not set it (or -tp), and --enable-sleep-mode when Sleep is set
// and Args do not set it.
// With a Command, Args and MaxModelLen are unused and {port}, {model}, {id} and
// {poold} (l.Self) are replaced anywhere inside each argument of Command; a
// command with Sleep set must pass --enable-sleep-mode itself.
func (p *Profile) Argv(port int, pool *PoolSpec, l Launch) []string {
	portStr := strconv.Itoa(port)
	if p.Command != nil {
		r := strings.NewReplacer("{port}", portStr, "{model}", p.Model, "{id}", p.ID, "{poold}", l.Self)
		argv := make([]string, len(p.Command))
		for i, a := range p.Command {
			argv[i] = r.Replace(a)
		}
		return argv
	}
	argv := append(slices.Clone(l.vllm()), "--model", p.Model, "--host", "127.0.0.1", "--port", portStr, "--served-model-name", p.ID)
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
// sleep endpoints) replaces any in Env. It is meant to be appended to
// Inherited(os.Environ()), so that its values win.
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

// Inherited returns the variables of environ (poold's own environment, as
// os.Environ gives it) that p's engine inherits, in environ's order: those an
// engine needs to find its tools, libraries, caches and GPUs (see
// inheritedNames and inheritedPrefixes) and those p's PassEnv names. Nothing
// else crosses: poold's own settings (POOLD_*, its API keys and admin token
// among them) never do, and neither do the vLLM variables that would change
// how poold talks to the engine (VLLM_API_KEY, VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)
// unless PassEnv names them.
func (p *Profile) Inherited(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if ok && (slices.Contains(p.PassEnv, k) || inheritable(k)) {
			out = append(out, kv)
		}
	}
	return out
}

// inheritedNames are the variables an engine inherits by name.
var inheritedNames = []string{
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
	"LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
	"OMP_NUM_THREADS", "MKL_NUM_THREADS",
}

// inheritedPrefixes are the prefixes of the variables an engine inherits:
// locale, XDG directories, Python, CUDA and NVIDIA, NCCL, Hugging Face, vLLM,
// PyTorch and Triton.
var inheritedPrefixes = []string{
	"LC_", "XDG_", "PYTHON", "CUDA_", "NVIDIA_", "NCCL_", "HF_", "HUGGING_FACE_",
	"TRANSFORMERS_", "VLLM_", "TORCH", "PYTORCH_", "TRITON_",
}

// notInherited are variables of the inherited families that only PassEnv or
// Env give an engine: an API key makes vLLM refuse poold's own probes, and
// keep-alive-on-death hides a dead engine from them.
var notInherited = []string{"VLLM_API_KEY", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"}

// inheritable reports whether an engine inherits variable k without PassEnv.
func inheritable(k string) bool {
	if slices.Contains(notInherited, k) {
		return false
	}
	return slices.Contains(inheritedNames, k) ||
		slices.ContainsFunc(inheritedPrefixes, func(p string) bool { return strings.HasPrefix(k, p) })
}
