package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// errClientGone ends a generation whose client stopped reading.
var errClientGone = errors.New("client gone")

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

type toolParam struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
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
	N                   *int            `json:"n"`
	Tools               []toolParam     `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	PromptLogprobs      *int            `json:"prompt_logprobs"`
	ReturnTokenIDs      *bool           `json:"return_token_ids"`
	KVTransferParams    map[string]any  `json:"kv_transfer_params"`
}

// plan is what one generation request will produce.
type plan struct {
	chat       bool
	id         string
	created    int64
	text       string // the prompt's text, for --enable-log-requests
	ids        []int  // the prompt's token ids
	completion int    // tokens per choice
	n          int    // choices
	finish     string // "stop", "length" or "tool_calls"
	stream     bool
	usage      bool      // final usage-only chunk
	contUsage  bool      // usage in every chunk
	tool       *toolCall // the answer is a call of this tool
	// The non-streaming answer's extras after usage, sized with the prompt.
	promptLogprobs, tokenIDs, kvTransfer bool
}

// toolCall is the simulated call of one tool: its arguments are a JSON
// object whose one member, key, holds the generated tokens.
type toolCall struct {
	id, name, key string
}

// arguments is the call's arguments with the first made tokens.
func (t *toolCall) arguments(made, completion int) string {
	var b strings.Builder
	for i := range made {
		b.WriteString(t.piece(i, completion))
	}
	return b.String()
}

// piece is the arguments' text that token i of completion adds.
func (t *toolCall) piece(i, completion int) string {
	var b []byte
	if i == 0 {
		k, _ := json.Marshal(t.key)
		b = append(append(append(b, '{'), k...), `: "`...)
	}
	b = appendToken(b, i)
	if i == completion-1 {
		b = append(b, `"}`...)
	}
	return string(b)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	s.handleGenerate(w, r, info, true)
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	s.handleGenerate(w, r, info, false)
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request, info *reqInfo, chat bool) {
	var req genRequest
	if !readBody(w, r, info, &req) {
		return
	}
	p := plan{chat: chat, created: time.Now().Unix(), n: 1}
	if req.Stream != nil && *req.Stream {
		p.stream = true
	}
	lastUser := ""
	if chat {
		if req.Messages == nil {
			badRequest(w, info, "Field required: messages")
			return
		}
		var texts []string
		for i, m := range *req.Messages {
			t, err := contentText(m.Content)
			if err != nil {
				badRequest(w, info, fmt.Sprintf("messages[%d].content: %v", i, err))
				return
			}
			texts = append(texts, t)
			if m.Role == "user" {
				lastUser = t
			}
		}
		p.text = strings.Join(texts, "\n")
		p.ids = tokenize(p.text)
	} else {
		if req.Prompt == nil {
			badRequest(w, info, "Field required: prompt")
			return
		}
		in, err := parseInput(req.Prompt)
		if err != nil {
			badRequest(w, info, fmt.Sprintf("prompt: %v", err))
			return
		}
		p.text = strings.Join(in.texts, "\n")
		p.ids = in.all()
	}
	if len(p.ids) == 0 {
		p.ids = []int{0} // an empty prompt still holds the BOS token
	}
	if !s.resolveModel(w, info, req.Model) {
		return
	}
	if so := req.StreamOptions; so != nil {
		if (so.IncludeUsage != nil || so.ContinuousUsageStats != nil) && !p.stream {
			badRequest(w, info, "Stream options can only be defined when `stream=True`.")
			return
		}
		// Inside stream_options, include_usage defaults to true.
		p.usage = so.IncludeUsage == nil || *so.IncludeUsage
		p.contUsage = p.usage && so.ContinuousUsageStats != nil && *so.ContinuousUsageStats
	}
	if s.cfg.EnableForceIncludeUsage && p.stream {
		// --enable-force-include-usage overrides stream_options, turning on
		// both the usage chunk and usage in every chunk
		// (should_include_usage in vllm/entrypoints/utils.py).
		p.usage, p.contUsage = true, true
	}
	if req.N != nil {
		if *req.N < 1 {
			badRequest(w, info, fmt.Sprintf("n must be at least 1, got %d.", *req.N))
			return
		}
		p.n = *req.N
	}
	if chat {
		tool, msg := s.chooseTool(&req, lastUser)
		if msg != "" {
			badRequest(w, info, msg)
			return
		}
		p.tool = tool
	}
	maxTokens := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	if !s.bound(w, info, &p, "max_tokens", maxTokens) {
		return
	}
	if p.tool != nil {
		p.finish = "tool_calls"
	}
	p.promptLogprobs = req.PromptLogprobs != nil
	p.tokenIDs = req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	p.kvTransfer = req.KVTransferParams != nil
	if chat {
		p.id = "chatcmpl-" + info.id
	} else {
		p.id = "cmpl-" + info.id
	}
	s.logRequest(&p)

	q, ok := s.admit(w, r, info, p.ids)
	if !ok {
		return
	}
	defer q.done()
	if p.stream {
		s.stream(w, q, &p, info)
	} else {
		s.complete(w, q, &p, info)
	}
}

// logRequest logs p's prompt with --enable-log-requests, as vLLM does.
func (s *Server) logRequest(p *plan) {
	if s.cfg.EnableLogRequests {
		s.logger.Info("Received request "+p.id, "prompt", p.text,
			"params", fmt.Sprintf("SamplingParams(n=%d, max_tokens=%d)", p.n, p.completion), "prompt_tokens", len(p.ids))
	}
}

// bound sets how many tokens p generates: maxTokens (the request's bound,
// named param; nil when it sets none), else --sim-tokens, within the
// context; it answers 400 and returns false when the prompt or the bound do
// not fit.
func (s *Server) bound(w http.ResponseWriter, info *reqInfo, p *plan, param string, maxTokens *int) bool {
	limit, prompt := s.cfg.MaxModelLen, len(p.ids)
	switch {
	case prompt >= limit:
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, prompt))
		return false
	case maxTokens != nil && *maxTokens < 1:
		badRequest(w, info, fmt.Sprintf("%s must be at least 1, got %d.", param, *maxTokens))
		return false
	case maxTokens != nil && prompt+*maxTokens > limit:
		badRequest(w, info, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", limit, prompt+*maxTokens, prompt, *maxTokens))
		return false
	case maxTokens != nil:
		p.completion, p.finish = *maxTokens, "length"
	case prompt+s.cfg.Tokens > limit:
		p.completion, p.finish = limit-prompt, "length"
	default:
		p.completion, p.finish = s.cfg.Tokens, "stop"
	}
	return true
}

// chooseTool decides whether the answer is a tool call, as vLLM's
// tool_choice does: "required" calls the first tool, a named function that
// one, and "auto" (the default when tools are given; it needs
// --enable-auto-tool-choice and --tool-call-parser) the first tool whose name
// the last user message contains, if any. msg is a 400's message.
func (s *Server) chooseTool(req *genRequest, lastUser string) (_ *toolCall, msg string) {
	choice, named := "none", ""
	switch {
	case len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null":
		if json.Unmarshal(req.ToolChoice, &choice) != nil {
			var obj struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(req.ToolChoice, &obj); err != nil || obj.Function.Name == "" {
				return nil, `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}`
			}
			choice, named = "named", obj.Function.Name
		}
	case len(req.Tools) > 0:
		choice = "auto"
	}
	find := func(match func(toolParam) bool) *toolCall {
		if i := slices.IndexFunc(req.Tools, match); i >= 0 {
			return newToolCall(req.Tools[i])
		}
		return nil
	}
	switch choice {
	case "none":
		return nil, ""
	case "auto":
		if !s.cfg.EnableAutoToolChoice || s.cfg.ToolCallParser == "" {
			return nil, `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`
		}
		return find(func(t toolParam) bool { return t.Function.Name != "" && strings.Contains(lastUser, t.Function.Name) }), ""
	case "required", "named":
		if len(req.Tools) == 0 {
			return nil, "When using `tool_choice`, `tools` must be set."
		}
		if choice == "required" {
			return newToolCall(req.Tools[0]), ""
		}
		if t := find(func(t toolParam) bool { return t.Function.Name == named }); t != nil {
			return t, ""
		}
		return nil, fmt.Sprintf("Tool '%s' has not been passed in `tools`.", named)
	}
	return nil, fmt.Sprintf("tool_choice: unknown value %q", choice)
}

// newToolCall plans a call of t that fills the first of its parameters' properties
// (by name), or "input".
func newToolCall(t toolParam) *toolCall {
	call := &toolCall{id: "chatcmpl-tool-" + randomHex(), name: t.Function.Name, key: "input"}
	var params struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(t.Function.Parameters, &params) == nil && len(params.Properties) > 0 {
		keys := make([]string, 0, len(params.Properties))
		for k := range params.Properties {
			keys = append(keys, k)
		}
		call.key = slices.Min(keys)
	}
	return call
}

// decode waits the time to first token, then makes p.completion tokens for
// every choice, ITL apart, calling emit(i) as token i is made. It returns how
// many tokens each choice got and, when it stopped early, why: the cause of
// q's context (the client left, /sleep aborted the request, the core died) or
// errClientGone when emit failed. It records in q what was made and why it
// ended.
func (s *Server) decode(q *request, p *plan, emit func(i int) bool) (made int, cause error) {
	defer func() {
		q.generated = p.n * made
		switch {
		case cause == nil:
			q.finish = engineFinish(p.finish)
		case errors.Is(cause, errCoreDead):
			q.finish = ""
		}
	}()
	var sl sleeper
	defer sl.stop()
	ctx := q.r.Context()
	last := time.Now()
	for i := range p.completion {
		d := s.cfg.ITL
		if i == 0 {
			d = s.cfg.TTFT
		}
		if !sl.sleep(ctx.Done(), d) || !q.awake(ctx.Done()) {
			return i, context.Cause(ctx)
		}
		now := time.Now()
		if i == 0 {
			s.metrics.ttft.Observe(now.Sub(q.start).Seconds())
		} else {
			s.metrics.itl.Observe(now.Sub(last).Seconds())
		}
		last = now
		q.grow(p.n)
		s.metrics.genTokens.Add(float64(p.n))
		if !emit(i) {
			return i, errClientGone
		}
		if s.sentTokens(p.n) {
			panic(http.ErrAbortHandler)
		}
	}
	return p.completion, nil
}

// engineFinish is the engine's finish reason for an answer's: a tool call
// ends on a stop token.
func engineFinish(answer string) string {
	if answer == "tool_calls" {
		return "stop"
	}
	return answer
}

// sentTokens records n content tokens sent and crashes the process once
// CrashAfterTokens is reached. It reports whether the process crashed (only
// possible when the crash hook returns, in tests).
func (s *Server) sentTokens(n int) bool {
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

// sleeper waits with one reusable timer, giving up when done is closed.
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

type usageInfo struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails any `json:"prompt_tokens_details"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type toolCallOut struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type chatOutMessage struct {
	Role             string        `json:"role"`
	Content          *string       `json:"content"`
	ReasoningContent *string       `json:"reasoning_content"`
	ToolCalls        []toolCallOut `json:"tool_calls"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatOutMessage `json:"message"`
	Logprobs     any            `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	StopReason   any            `json:"stop_reason"`
	TokenIDs     []int          `json:"token_ids,omitempty"`
}

// chatResponse is vLLM's chat completion; the members after usage grow with
// the prompt when the request asks for them.
type chatResponse struct {
	ID               string         `json:"id"`
	Object           string         `json:"object"`
	Created          int64          `json:"created"`
	Model            string         `json:"model"`
	Choices          []chatChoice   `json:"choices"`
	Usage            usageInfo      `json:"usage"`
	PromptLogprobs   []any          `json:"prompt_logprobs"`
	PromptTokenIDs   []int          `json:"prompt_token_ids"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

type completionChoice struct {
	Index          int    `json:"index"`
	Text           string `json:"text"`
	Logprobs       any    `json:"logprobs"`
	FinishReason   string `json:"finish_reason"`
	StopReason     any    `json:"stop_reason"`
	TokenIDs       []int  `json:"token_ids,omitempty"`
	PromptLogprobs []any  `json:"prompt_logprobs"`
	PromptTokenIDs []int  `json:"prompt_token_ids,omitempty"`
}

type completionResponse struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []completionChoice `json:"choices"`
	Usage            usageInfo          `json:"usage"`
	KVTransferParams map[string]any     `json:"kv_transfer_params"`
}

type promptLogprob struct {
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptLogprobs is vLLM's prompt_logprobs for ids: null for the first
// token, then one entry per token.
func promptLogprobs(ids []int) []any {
	out := make([]any, len(ids))
	for i, id := range ids[1:] {
		out[i+1] = map[string]promptLogprob{strconv.Itoa(id): {
			Logprob: -float64(id%997+1) / 100, Rank: 1, DecodedToken: "w" + strconv.Itoa(id),
		}}
	}
	return out
}

// kvTransferParams is what a prefill engine returns for a request that asked
// for a remote decode: the KV cache's blocks the prompt filled.
func (s *Server) kvTransferParams(prompt int) map[string]any {
	blocks := make([]int, (prompt+prefixBlock-1)/prefixBlock)
	for i := range blocks {
		blocks[i] = i
	}
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": blocks,
		"remote_engine_id": "engine-sim-" + s.model, "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1,
	}
}

// decodeEnded reads how decode ended: it reports whether the answer goes
// on. A dead engine core is answered by fail (a 500, or a stream's error
// event); a client gone is recorded as 499; a request that /sleep or the end
// of --shutdown-timeout aborted goes on with what it made, its plan's
// finish "abort".
func (s *Server) decodeEnded(cause error, p *plan, info *reqInfo, fail func()) bool {
	switch {
	case errors.Is(cause, errCoreDead):
		fail()
		return false
	case isAbort(cause):
		p.finish = "abort"
	case cause != nil:
		info.status = 499
		return false
	}
	return true
}

// complete answers a non-streaming request once its tokens are made. A
// request that /sleep aborted answers what it made, with finish_reason
// "abort".
func (s *Server) complete(w http.ResponseWriter, q *request, p *plan, info *reqInfo) {
	made, cause := s.decode(q, p, func(int) bool { return true })
	if !s.decodeEnded(cause, p, info, func() { s.failDead(w, info) }) {
		return
	}
	finish := p.finish
	text := tokensText(made)
	var tokenIDs []int
	if p.tokenIDs {
		tokenIDs = tokenize(string(text))
	}
	prompt := len(p.ids)
	usage := usageInfo{PromptTokens: prompt, CompletionTokens: p.n * made, TotalTokens: prompt + p.n*made}
	var b []byte
	if p.chat {
		resp := chatResponse{ID: p.id, Object: "chat.completion", Created: p.created, Model: s.model, Usage: usage}
		for c := range p.n {
			msg := chatOutMessage{Role: "assistant", ToolCalls: []toolCallOut{}}
			if p.tool != nil {
				msg.ToolCalls = []toolCallOut{{ID: p.tool.id, Type: "function",
					Function: functionCall{Name: p.tool.name, Arguments: p.tool.arguments(made, p.completion)}}}
			} else {
				content := string(text)
				msg.Content = &content
			}
			resp.Choices = append(resp.Choices, chatChoice{Index: c, Message: msg, FinishReason: finish, TokenIDs: tokenIDs})
		}
		if p.promptLogprobs {
			resp.PromptLogprobs = promptLogprobs(p.ids)
		}
		if p.tokenIDs {
			resp.PromptTokenIDs = p.ids
		}
		if p.kvTransfer {
			resp.KVTransferParams = s.kvTransferParams(prompt)
		}
		b, _ = json.Marshal(resp)
	} else {
		resp := completionResponse{ID: p.id, Object: "text_completion", Created: p.created, Model: s.model, Usage: usage}
		for c := range p.n {
			ch := completionChoice{Index: c, Text: string(text), FinishReason: finish, TokenIDs: tokenIDs}
			if p.promptLogprobs {
				ch.PromptLogprobs = promptLogprobs(p.ids)
			}
			if p.tokenIDs {
				ch.PromptTokenIDs = p.ids
			}
			resp.Choices = append(resp.Choices, ch)
		}
		if p.kvTransfer {
			resp.KVTransferParams = s.kvTransferParams(prompt)
		}
		b, _ = json.Marshal(resp)
	}
	s.writeResult(w, b)
}
