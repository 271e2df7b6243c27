package enginesim

import (
	"fmt"
	"net/http"
	"os"
	"slices"
)

// logAccess writes r's line of the access log, answered status, as vLLM's
// HTTP server (uvicorn) prints it on stdout under a pipe, behind the prefix
// that vLLM gives every line of its API server process
// (vllm/utils/system_utils.py, decorate_logs; no colours without a
// terminal):
//
//	(APIServer pid=1234) INFO:     127.0.0.1:56790 - "GET /metrics HTTP/1.1" 200 OK
//
// uvicorn prints it as the answer's headers go, the simulator once the
// answer ends. --disable-uvicorn-access-log prints none, and
// --disable-access-log-for-endpoints none for the paths it lists, matched
// whole, without the query (vllm/logging_utils/access_log_filter.py).
func (s *Server) logAccess(r *http.Request, status int) {
	if s.access == nil || s.cfg.DisableAccessLog || slices.Contains(s.cfg.AccessLogSkip, r.URL.Path) {
		return
	}
	fmt.Fprintf(s.access, "(APIServer pid=%d) INFO:     %s - \"%s %s HTTP/%d.%d\" %d %s\n",
		os.Getpid(), r.RemoteAddr, r.Method, r.URL.RequestURI(), r.ProtoMajor, r.ProtoMinor, status, http.StatusText(status))
}
