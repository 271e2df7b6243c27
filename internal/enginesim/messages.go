package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// messagesRequest is what the simulator reads of an Anthropic Messages API
// request (POST /v1/messages).
type messagesRequest struct {
	Model     *string         `json:"model"`
	Messages  *[]chatMessage  `json:"messages"`
	System    json.RawMessage `json:"system"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    *bool           `json:"stream"`
}

// stopReasons maps a finish reason to the Messages API's stop_reason; vLLM
// has none for an aborted request.
var stopReasons = map[string]any{"stop": "end_turn", "length": "max_tokens"}

// handleMessages serves POST /v1/messages as vLLM does, through its chat
// path: one text block, bounded by max_tokens (required), its usage
// input_tokens and output_tokens; streamed, as the Messages API's events,
// the input tokens in message_start and both counts in message_delta.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req messagesRequest
	if !readBody(w, r, info, &req) {
		return
	}
	if req.Messages == nil {
		badRequest(w, info, "Field required: messages")
		return
	}
	if req.MaxTokens == nil {
		badRequest(w, info, "Field required: max_tokens")
		return
	}
	system, err := contentText(req.System)
	if err != nil {
		badRequest(w, info, "system: "+err.Error())
		return
	}
	texts := []string{system}
	for i, m := range *req.Messages {
		t, err := contentText(m.Content)
		if err != nil {
			badRequest(w, info, fmt.Sprintf("messages[%d].content: %v", i, err))
			return
		}
		texts = append(texts, t)
	}
	p := plan{chat: true, id: "chatcmpl-" + info.id, created: time.Now().Unix(), n: 1, text: strings.Join(texts, "\n")}
	if p.ids = tokenize(p.text); len(p.ids) == 0 {
		p.ids = []int{0}
	}
	if req.Stream != nil && *req.Stream {
		p.stream = true
	}
	if !s.resolveModel(w, info, req.Model) || !s.bound(w, info, &p, "max_tokens", req.MaxTokens) {
		return
	}
	s.answerText(w, r, info, &p, func(q *request) { s.streamMessage(w, q, &p, info) }, func(made int) []byte {
		b, _ := json.Marshal(messageObject{ID: p.id, Type: "message", Role: "assistant",
			Content: []contentBlock{{Type: "text", Text: string(tokensText(made))}}, Model: s.model, StopReason: stopReasons[p.finish],
			Usage: &messageUsage{InputTokens: len(p.ids), OutputTokens: made}})
		return b
	})
}

type messageUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type contentBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messageObject is vLLM's AnthropicMessagesResponse; in message_start it
// lacks type and role, which vLLM leaves unset there.
type messageObject struct {
	ID           string         `json:"id"`
	Type         string         `json:"type,omitempty"`
	Role         string         `json:"role,omitempty"`
	Content      []contentBlock `json:"content"`
	Model        string         `json:"model"`
	StopReason   any            `json:"stop_reason"`
	StopSequence any            `json:"stop_sequence"`
	Usage        *messageUsage  `json:"usage"`
}

// messageEvent is one event of a Messages stream; the members that an event
// type lacks are left out.
type messageEvent struct {
	Type         string         `json:"type"`
	Message      *messageObject `json:"message,omitempty"`
	Index        *int           `json:"index,omitempty"`
	ContentBlock *contentBlock  `json:"content_block,omitempty"`
	Delta        any            `json:"delta,omitempty"`
	Usage        *messageUsage  `json:"usage,omitempty"`
}

// streamMessage answers a streaming Messages request with vLLM's events:
// message_start (the input tokens), a text block (content_block_start, a
// content_block_delta per token, content_block_stop), message_delta (both
// counts), message_stop. A request that met the core's death ends with
// vLLM's error event.
func (s *Server) streamMessage(w http.ResponseWriter, q *request, p *plan, info *reqInfo) {
	out := newSSE(w, s.eventEnd)
	send := func(e messageEvent) bool {
		b, _ := json.Marshal(e)
		return out.named(e.Type, b)
	}
	prompt, zero := len(p.ids), 0
	if !send(messageEvent{Type: "message_start", Message: &messageObject{ID: p.id, Content: []contentBlock{}, Model: s.model,
		Usage: &messageUsage{InputTokens: prompt}}}) {
		info.status = 499
		return
	}
	made, cause := s.decode(q, p, func(i int) bool {
		if i == 0 && !send(messageEvent{Type: "content_block_start", Index: &zero, ContentBlock: &contentBlock{Type: "text"}}) {
			return false
		}
		return send(messageEvent{Type: "content_block_delta", Index: &zero, Delta: contentBlock{Type: "text_delta", Text: string(appendToken(nil, i))}})
	})
	if !s.decodeEnded(cause, p, info, func() { s.failDeadStream(out) }) {
		return
	}
	if made > 0 {
		send(messageEvent{Type: "content_block_stop", Index: &zero})
	}
	send(messageEvent{Type: "message_delta", Delta: map[string]any{"stop_reason": stopReasons[p.finish]},
		Usage: &messageUsage{InputTokens: prompt, OutputTokens: made}})
	send(messageEvent{Type: "message_stop"})
}
