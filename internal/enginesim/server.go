package enginesim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
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

// embeddingDim is the length of every simulated embedding.
const embeddingDim = 8

// Server is the simulated vLLM OpenAI-compatible API server. It is an http.Handler,
// usable directly with httptest; Run serves it on a listener. Create it with
// NewHandler: the zero value is not usable. It is safe for concurrent use.
type Server struct {
	cfg       Config
	logger    *slog.Logger
	metrics   *simMetrics
	names     map[string]struct{} // served names
	model     string              // first served name: responses' "model" and the metrics label
	modelJSON string              // model as a JSON string literal

	// tokensSent counts content tokens sent by all requests (for CrashAfterTokens).
	tokensSent atomic.Int64
	// crash is called once CrashAfterTokens is reached; by default it SIGKILLs the
	// process. Tests may replace it before serving.
	crash func()

	mu      sync.Mutex // guards running, sleep and the order of updates to the running and KV gauges
	running int        // requests being generated now
	sleep   sleepState
	// aborted counts the in-flight requests /sleep aborted.
	aborted atomic.Int64

	// slots holds a token per generating request when MaxNumSeqs bounds them;
	// nil means no bound.
	slots chan struct{}
}

// NewHandler returns a Server for cfg (as returned by ParseFlags; a zero Tokens or
// MaxModelLen falls back to the defaults). logger receives one line per request; nil
// discards them.
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
	s := &Server{
		cfg:     cfg,
		logger:  logger,
		metrics: newSimMetrics(cfg.ServedModelNames[0]),
		names:   make(map[string]struct{}, len(cfg.ServedModelNames)),
		model:   cfg.ServedModelNames[0],
		crash: func() {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		},
	}
	for _, n := range cfg.ServedModelNames {
		s.names[n] = struct{}{}
	}
	mj, _ := json.Marshal(s.model)
	s.modelJSON = string(mj)
	if cfg.MaxNumSeqs > 0 {
		s.slots = make(chan struct{}, cfg.MaxNumSeqs)
	}
	return s
}

// reqInfo collects what the request log line reports.
type reqInfo struct {
	model  string
	stream bool
	status int
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.LogHeaders {
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request headers",
			slog.String("path", r.URL.Path), slog.String("headers", strings.Join(slices.Sorted(maps.Keys(r.Header)), ",")))
	}
	if s.cfg.Hang || (s.cfg.HangRequests && r.Method == http.MethodPost) {
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request hanging (--sim-hang)",
			slog.String("method", r.Method), slog.String("path", r.URL.Path))
		// Read the body, so that the server notices when the client goes away.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBodyBytes))
		<-r.Context().Done()
		return
	}
	if s.cfg.FailRequests && r.Method == http.MethodPost {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, maxBodyBytes))
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request failed (--sim-fail-requests)", slog.String("path", r.URL.Path))
		writeError(w, &reqInfo{}, http.StatusInternalServerError, "InternalServerError", "", "simulated failure (--sim-fail-requests)")
		return
	}
	info := reqInfo{status: http.StatusOK}
	if s.serveSleep(w, r, &info) {
		s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", info.status))
		return
	}
	switch r.URL.Path {
	case "/health", "/ping":
		if s.allow(w, r, &info, http.MethodGet, http.MethodPost) {
			w.WriteHeader(http.StatusOK)
		}
	case "/v1/models":
		if s.allow(w, r, &info, http.MethodGet) {
			s.handleModels(w)
		}
	case "/metrics":
		if s.allow(w, r, &info, http.MethodGet) {
			s.metrics.handler.ServeHTTP(w, r)
		}
	case "/v1/chat/completions":
		if s.allow(w, r, &info, http.MethodPost) {
			s.handleGenerate(w, r, &info, true)
		}
	case "/v1/completions":
		if s.allow(w, r, &info, http.MethodPost) {
			s.handleGenerate(w, r, &info, false)
		}
	case "/v1/embeddings":
		if s.allow(w, r, &info, http.MethodPost) {
			s.handleEmbeddings(w, r, &info)
		}
	default:
		info.status = http.StatusNotFound
		writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
	}
	s.logger.LogAttrs(r.Context(), slog.LevelInfo, "request",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("model", info.model), slog.Bool("stream", info.stream),
		slog.Int("status", info.status))
}

// allow answers 405 as FastAPI does unless r uses one of methods.
func (s *Server) allow(w http.ResponseWriter, r *http.Request, info *reqInfo, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
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
	e := errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}}
	if param != "" {
		e.Error.Param = &param
	}
	b, _ := json.Marshal(e)
	writeJSON(w, status, b)
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

func (s *Server) handleModels(w http.ResponseWriter) {
	now := time.Now().Unix()
	list := modelList{Object: "list", Data: make([]modelCard, 0, len(s.cfg.ServedModelNames))}
	for _, n := range s.cfg.ServedModelNames {
		list.Data = append(list.Data, modelCard{
			ID: n, Object: "model", Created: now, OwnedBy: "vllm", Root: s.cfg.Model,
			MaxModelLen: s.cfg.MaxModelLen,
			Permission: []modelPermission{{
				ID: randomID("modelperm-"), Object: "model_permission", Created: now,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		})
	}
	b, _ := json.Marshal(list)
	writeJSON(w, http.StatusOK, b)
}

// randomID returns prefix followed by 32 random hex digits, like vLLM's ids.
func randomID(prefix string) string {
	b := make([]byte, 0, len(prefix)+32)
	b = append(b, prefix...)
	for range 2 {
		u := rand.Uint64()
		for i := 60; i >= 0; i -= 4 {
			b = append(b, "0123456789abcdef"[(u>>uint(i))&0xf])
		}
	}
	return string(b)
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// genRequest is the union of the chat and completions request fields the simulator
// reads; the rest is ignored, as vLLM ignores unknown fields.
type genRequest struct {
	Model               *string         `json:"model"`
	Messages            *[]chatMessage  `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
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
		info.model = s.model
		return true
	}
	info.model = *model
	if _, ok := s.names[*model]; !ok {
		writeError(w, info, http.StatusNotFound, "NotFoundError", "model",
			fmt.Sprintf("The model `%s` does not exist.", *model))
		return false
	}
	return true
}

// countWords counts whitespace-separated words in s.
func countWords(s string) int {
	n, in := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r', '\v', '\f':
			in = false
		default:
			if !in {
				n++
				in = true
			}
		}
	}
	return n
}

// contentWords counts the words of a chat message content: a string, null, or an
// array of parts whose "text" parts count.
func contentWords(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, err
		}
		return countWords(s), nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return 0, err
		}
		n := 0
		for _, p := range parts {
			if p.Type == "text" {
				n += countWords(p.Text)
			}
		}
		return n, nil
	}
	return 0, errors.New("content must be a string or an array of content parts")
}

// inputTokens counts a prompt or embeddings input: a string, an array of strings,
// an array of token ids or an array of arrays of token ids. items is the number of
// separate inputs (for embeddings).
func inputTokens(raw json.RawMessage) (tokens, items int, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, 0, errors.New("missing")
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return countWords(str), 1, nil
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		for _, s := range strs {
			tokens += countWords(s)
		}
		return tokens, len(strs), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return len(ids), 1, nil
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		for _, ids := range idss {
			tokens += len(ids)
		}
		return tokens, len(idss), nil
	}
	return 0, 0, errors.New("must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
}

// plan is what one generation request will produce.
type plan struct {
	chat       bool
	id         string
	created    int64
	prompt     int
	completion int
	finish     string // "stop" or "length"
	stream     bool
	usage      bool // final usage-only chunk
	contUsage  bool // usage in every chunk
	start      time.Time
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request, info *reqInfo, chat bool) {
	start := time.Now()
	var req genRequest
	if !readBody(w, r, info, &req) {
		return
	}
	p := plan{chat: chat, created: start.Unix(), start: start}
	if req.Stream != nil && *req.Stream {
		p.stream = true
		info.stream = true
	}
	if chat {
		if req.Messages == nil {
			badRequest(w, info, "Field required: messages")
			return
		}
		for i, m := range *req.Messages {
			n, err := contentWords(m.Content)
			if err != nil {
				badRequest(w, info, fmt.Sprintf("messages[%d].content: %v", i, err))
				return
			}
			p.prompt += n
		}
	} else {
		if req.Prompt == nil {
			badRequest(w, info, "Field required: prompt")
			return
		}
		n, _, err := inputTokens(req.Prompt)
		if err != nil {
			badRequest(w, info, fmt.Sprintf("prompt: %v", err))
			return
		}
		p.prompt = n
	}
	p.prompt = max(p.prompt, 1)
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	if so := req.StreamOptions; so != nil && (so.IncludeUsage != nil || so.ContinuousUsageStats != nil) {
		if !p.stream {
			badRequest(w, info, "Stream options can only be defined when `stream=True`.")
			return
		}
		p.usage = so.IncludeUsage != nil && *so.IncludeUsage
		p.contUsage = p.usage && so.ContinuousUsageStats != nil && *so.ContinuousUsageStats
	}
	maxTokens := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	limit := s.cfg.MaxModelLen
	switch {
	case p.prompt >= limit:
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, p.prompt))
		return
	case maxTokens != nil && *maxTokens < 1:
		badRequest(w, info, fmt.Sprintf("max_tokens must be at least 1, got %d.", *maxTokens))
		return
	case maxTokens != nil && p.prompt+*maxTokens > limit:
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", limit, p.prompt+*maxTokens, p.prompt, *maxTokens))
		return
	case maxTokens != nil:
		p.completion, p.finish = *maxTokens, "length"
	case p.prompt+s.cfg.Tokens > limit:
		p.completion, p.finish = limit-p.prompt, "length"
	default:
		p.completion, p.finish = s.cfg.Tokens, "stop"
	}
	if chat {
		p.id = randomID("chatcmpl-")
	} else {
		p.id = randomID("cmpl-")
	}

	r, leaveSleep, ok := s.enter(w, r, info)
	if !ok {
		return
	}
	defer leaveSleep()
	if !s.admit(r.Context()) {
		info.status = 499 // the client left while waiting for a slot
		return
	}
	defer s.leave()
	s.begin(p.prompt)
	defer s.end(start)
	if p.stream {
		s.stream(w, r, &p)
	} else {
		s.complete(w, r, info, &p)
	}
}

// admit waits for a generation slot (--max-num-seqs), counting the request as
// waiting meanwhile; it reports false if ctx ends first.
func (s *Server) admit(ctx context.Context) bool {
	if s.slots == nil {
		return true
	}
	s.metrics.waiting.Inc()
	defer s.metrics.waiting.Dec()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// leave frees the slot admit took.
func (s *Server) leave() {
	if s.slots != nil {
		<-s.slots
	}
}

// begin and end account a request in the running gauges.
func (s *Server) begin(promptTokens int) {
	s.metrics.promptTokens.Add(float64(promptTokens))
	s.setRunning(+1)
}

func (s *Server) end(start time.Time) {
	s.setRunning(-1)
	s.metrics.e2e.Observe(time.Since(start).Seconds())
}

func (s *Server) setRunning(delta int) {
	s.mu.Lock()
	s.running += delta
	n := s.running
	s.metrics.running.Set(float64(n))
	s.metrics.kvUsage.Set(math.Min(float64(n)/kvCapacity, 1))
	s.mu.Unlock()
}

// sentTokens records n content tokens sent and crashes the process once
// CrashAfterTokens is reached. It reports whether the process crashed (only
// possible when the crash hook returns, in tests).
func (s *Server) sentTokens(n int) bool {
	s.metrics.genTokens.Add(float64(n))
	if s.cfg.CrashAfterTokens <= 0 {
		return false
	}
	if s.tokensSent.Add(int64(n)) >= int64(s.cfg.CrashAfterTokens) {
		s.logger.Error("simulated crash (--sim-crash-after-tokens)", "tokens", s.tokensSent.Load())
		s.crash()
		return true
	}
	return false
}

// sleeper waits with one reusable timer, giving up when ctx ends.
type sleeper struct {
	t *time.Timer
}

func (sl *sleeper) sleep(done <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	if sl.t == nil {
		sl.t = time.NewTimer(d)
	} else {
		sl.t.Reset(d)
	}
	select {
	case <-done:
		sl.t.Stop()
		return false
	case <-sl.t.C:
		return true
	}
}

func (sl *sleeper) stop() {
	if sl.t != nil {
		sl.t.Stop()
	}
}

// appendToken appends the deterministic text of token i: "tok<i> ".
func appendToken(b []byte, i int) []byte {
	b = append(b, "tok"...)
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, ' ')
}

type usageInfo struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails any `json:"prompt_tokens_details"`
}

type chatOutMessage struct {
	Role             string   `json:"role"`
	Content          string   `json:"content"`
	ReasoningContent *string  `json:"reasoning_content"`
	ToolCalls        []string `json:"tool_calls"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatOutMessage `json:"message"`
	Logprobs     any            `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	StopReason   any            `json:"stop_reason"`
}

type chatResponse struct {
	ID               string       `json:"id"`
	Object           string       `json:"object"`
	Created          int64        `json:"created"`
	Model            string       `json:"model"`
	Choices          []chatChoice `json:"choices"`
	Usage            usageInfo    `json:"usage"`
	PromptLogprobs   any          `json:"prompt_logprobs"`
	KVTransferParams any          `json:"kv_transfer_params"`
}

type completionChoice struct {
	Index          int    `json:"index"`
	Text           string `json:"text"`
	Logprobs       any    `json:"logprobs"`
	FinishReason   string `json:"finish_reason"`
	StopReason     any    `json:"stop_reason"`
	PromptLogprobs any    `json:"prompt_logprobs"`
}

type completionResponse struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []completionChoice `json:"choices"`
	Usage            usageInfo          `json:"usage"`
	KVTransferParams any                `json:"kv_transfer_params"`
}

// complete answers a non-streaming request after the simulated generation time.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, info *reqInfo, p *plan) {
	var sl sleeper
	defer sl.stop()
	done := r.Context().Done()
	ended := func() {
		info.status = 499
		if abortedBySleep(r) {
			writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", errSleepAbort.Error())
		}
	}
	if !sl.sleep(done, s.cfg.TTFT) {
		ended()
		return
	}
	s.metrics.ttft.Observe(time.Since(p.start).Seconds())
	if p.completion > 1 && !sl.sleep(done, time.Duration(p.completion-1)*s.cfg.ITL) {
		ended()
		return
	}
	text := make([]byte, 0, p.completion*7)
	for i := range p.completion {
		text = appendToken(text, i)
	}
	if s.sentTokens(p.completion) {
		panic(http.ErrAbortHandler)
	}
	usage := usageInfo{PromptTokens: p.prompt, CompletionTokens: p.completion, TotalTokens: p.prompt + p.completion}
	var b []byte
	if p.chat {
		b, _ = json.Marshal(chatResponse{
			ID: p.id, Object: "chat.completion", Created: p.created, Model: s.model,
			Choices: []chatChoice{{
				Message:      chatOutMessage{Role: "assistant", Content: string(text), ToolCalls: []string{}},
				FinishReason: p.finish,
			}},
			Usage: usage,
		})
	} else {
		b, _ = json.Marshal(completionResponse{
			ID: p.id, Object: "text_completion", Created: p.created, Model: s.model,
			Choices: []completionChoice{{Text: string(text), FinishReason: p.finish}},
			Usage:   usage,
		})
	}
	writeJSON(w, http.StatusOK, b)
}

// stream answers a streaming request with server-sent events, building every chunk
// by appending to one buffer: the constant head of the chunk is rendered once.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, p *plan) {
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}

	object := "text_completion"
	if p.chat {
		object = "chat.completion.chunk"
	}
	head := make([]byte, 0, 160)
	head = append(head, `data: {"id":"`...)
	head = append(head, p.id...)
	head = append(head, `","object":"`...)
	head = append(head, object...)
	head = append(head, `","created":`...)
	head = strconv.AppendInt(head, p.created, 10)
	head = append(head, `,"model":`...)
	head = append(head, s.modelJSON...)
	head = append(head, `,"choices":[`...)

	buf := make([]byte, 0, len(head)+200)
	appendUsage := func(b []byte, completion int) []byte {
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(p.prompt), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(p.prompt+completion), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(completion), 10)
		return append(b, '}')
	}
	send := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}

	var sl sleeper
	defer sl.stop()
	defer func() {
		if abortedBySleep(r) {
			send([]byte(`data: {"error":{"message":"` + errSleepAbort.Error() + `","type":"InternalServerError","param":null,"code":500}}` + "\n\n"))
		}
	}()
	done := r.Context().Done()
	if !sl.sleep(done, s.cfg.TTFT) {
		return
	}
	if p.chat {
		buf = append(buf[:0], head...)
		buf = append(buf, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		if p.contUsage {
			buf = appendUsage(buf, 0)
		}
		buf = append(buf, "}\n\n"...)
		if !send(buf) {
			return
		}
	}
	last := time.Now()
	s.metrics.ttft.Observe(last.Sub(p.start).Seconds())
	for i := range p.completion {
		if i > 0 {
			if !sl.sleep(done, s.cfg.ITL) {
				return
			}
			now := time.Now()
			s.metrics.itl.Observe(now.Sub(last).Seconds())
			last = now
		}
		buf = append(buf[:0], head...)
		if p.chat {
			buf = append(buf, `{"index":0,"delta":{"content":"`...)
			buf = appendToken(buf, i)
			buf = append(buf, `"},"logprobs":null,"finish_reason":`...)
		} else {
			buf = append(buf, `{"index":0,"text":"`...)
			buf = appendToken(buf, i)
			buf = append(buf, `","logprobs":null,"finish_reason":`...)
		}
		if i == p.completion-1 {
			buf = append(buf, '"')
			buf = append(buf, p.finish...)
			buf = append(buf, `","stop_reason":null}]`...)
		} else if p.chat {
			buf = append(buf, `null}]`...)
		} else {
			buf = append(buf, `null,"stop_reason":null}]`...)
		}
		if p.contUsage {
			buf = appendUsage(buf, i+1)
		}
		buf = append(buf, "}\n\n"...)
		if !send(buf) {
			return
		}
		if s.sentTokens(1) {
			panic(http.ErrAbortHandler)
		}
	}
	if p.usage {
		buf = append(buf[:0], head...)
		buf = append(buf, ']')
		buf = appendUsage(buf, p.completion)
		buf = append(buf, "}\n\n"...)
		if !send(buf) {
			return
		}
	}
	send([]byte("data: [DONE]\n\n"))
}

type embeddingRequest struct {
	Model          *string         `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
}

type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"`
}

type embeddingResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   usageInfo       `json:"usage"`
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	start := time.Now()
	var req embeddingRequest
	if !readBody(w, r, info, &req) {
		return
	}
	if req.Input == nil {
		badRequest(w, info, "Field required: input")
		return
	}
	tokens, items, err := inputTokens(req.Input)
	if err != nil {
		badRequest(w, info, fmt.Sprintf("input: %v", err))
		return
	}
	tokens = max(tokens, 1)
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	b64 := false
	if req.EncodingFormat != nil {
		switch *req.EncodingFormat {
		case "float":
		case "base64":
			b64 = true
		default:
			badRequest(w, info, fmt.Sprintf("encoding_format: unsupported value %q (use float or base64)", *req.EncodingFormat))
			return
		}
	}
	if tokens > s.cfg.MaxModelLen {
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.", s.cfg.MaxModelLen, tokens))
		return
	}
	r, leaveSleep, ok := s.enter(w, r, info)
	if !ok {
		return
	}
	defer leaveSleep()
	s.begin(tokens)
	defer s.end(start)
	var sl sleeper
	defer sl.stop()
	if !sl.sleep(r.Context().Done(), s.cfg.TTFT) {
		info.status = 499
		if abortedBySleep(r) {
			writeError(w, info, http.StatusInternalServerError, "InternalServerError", "", errSleepAbort.Error())
		}
		return
	}
	resp := embeddingResponse{
		ID: randomID("embd-"), Object: "list", Created: start.Unix(), Model: s.model,
		Data:  make([]embeddingData, items),
		Usage: usageInfo{PromptTokens: tokens, TotalTokens: tokens},
	}
	for i := range items {
		vec := embedding(req.Input, i)
		d := embeddingData{Index: i, Object: "embedding"}
		if b64 {
			raw := make([]byte, 4*len(vec))
			for j, f := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(f))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(raw)
		} else {
			d.Embedding = vec
		}
		resp.Data[i] = d
	}
	b, _ := json.Marshal(resp)
	writeJSON(w, http.StatusOK, b)
}

// embedding returns a deterministic unit vector for input item i.
func embedding(input json.RawMessage, i int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write(input)
	_, _ = h.Write([]byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)})
	seed := h.Sum64()
	vec := make([]float32, embeddingDim)
	var norm float64
	for j := range vec {
		seed = seed*6364136223846793005 + 1442695040888963407
		v := float64(int32(seed>>32)) / math.MaxInt32
		vec[j] = float32(v)
		norm += v * v
	}
	if norm == 0 {
		vec[0], norm = 1, 1
	}
	for j := range vec {
		vec[j] = float32(float64(vec[j]) / math.Sqrt(norm))
	}
	return vec
}
