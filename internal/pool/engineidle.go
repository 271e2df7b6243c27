package pool

import (
	"strconv"
	"strings"
	"time"
)

// keepAliveEnv is the environment variable vLLM's HTTP server reads for how
// long (whole seconds, default 5) it keeps an idle connection open.
const keepAliveEnv = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"

// defaultKeepAlive is vLLM's default for keepAliveEnv (uvicorn's too).
const defaultKeepAlive = 5 * time.Second

// idleTimeout is how long poold keeps an idle connection to an engine whose
// environment is env (KEY=value pairs, the last one winning): four fifths
// of the engine's keep-alive, 4 s for vLLM's default, so that poold closes
// an idle connection before the engine does and never sends a request on
// one the engine is closing. A keep-alive that does not parse as vLLM reads
// it counts as the default (vLLM refuses to start with it anyway); one of
// zero or less keeps no connection idle.
func idleTimeout(env []string) time.Duration {
	keepAlive := defaultKeepAlive
	for _, kv := range env {
		v, ok := strings.CutPrefix(kv, keepAliveEnv+"=")
		if !ok {
			continue
		}
		keepAlive = defaultKeepAlive
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			keepAlive = time.Duration(n) * time.Second
		}
	}
	if keepAlive <= 0 {
		return time.Nanosecond
	}
	return keepAlive * 4 / 5
}
