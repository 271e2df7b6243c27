package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// responsesRequest is what the simulator reads of a Responses API request
// (POST /v1/responses).
type responsesRequest struct {
	Model           *string         `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          *bool           `json:"stream"`
}

// responsesInput is the text of a Responses input: a string, or an array of
// messages whose content is a string or an array of parts.
func responsesInput(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		//lint:ignore ST1005 vLLM's own message, word for word
		return "", errors.New("Field required")
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str, nil
	}
	var items []chatMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", errors.New("must be a string or an array of input items")
	}
	texts := make([]string, 0, len(items))
	for i, it := range items {
		t, err := contentText(it.Content)
		if err != nil {
			return "", fmt.Errorf("[%d].content: %w", i, err)
		}
		texts = append(texts, t)
	}
	return strings.Join(texts, "\n"), nil
}

// handleResponses serves POST /v1/responses as vLLM does: one message of
// generated text, bounded by max_output_tokens, its usage input_tokens and
// output_tokens; streamed, as the Responses API's named events, the usage
// in response.completed.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	var req responsesRequest
	if !readBody(w, r, info, &req) {
		return
	}
	text, err := responsesInput(req.Input)
	if err != nil {
		badRequest(w, info, "input: "+err.Error())
		return
	}
	if req.Instructions != nil {
		text = *req.Instructions + "\n" + text
	}
	p := plan{id: "resp_" + info.id, created: time.Now().Unix(), n: 1, text: text, ids: tokenize(text)}
	if len(p.ids) == 0 {
		p.ids = []int{0}
	}
	if req.Stream != nil && *req.Stream {
		p.stream = true
	}
	if !s.resolveModel(w, info, req.Model) || !s.bound(w, info, &p, "max_output_tokens", req.MaxOutputTokens) {
		return
	}
	s.answerText(w, r, info, &p, func(q *request) { s.streamResponse(w, q, &p, info, req.MaxOutputTokens) }, func(made int) []byte {
		b, _ := json.Marshal(s.response(&p, req.MaxOutputTokens, "completed", made))
		return b
	})
}

// answerText answers a plan of generated text on the Messages and
// Responses routes, once admitted: streamed by stream, or whole, in the
// body that whole makes of the tokens made.
func (s *Server) answerText(w http.ResponseWriter, r *http.Request, info *reqInfo, p *plan, stream func(*request), whole func(made int) []byte) {
	s.logRequest(p)
	q, ok := s.admit(w, r, info, p.ids)
	if !ok {
		return
	}
	defer q.done()
	if p.stream {
		stream(q)
		return
	}
	made, cause := s.decode(q, p, func(int) bool { return true })
	if !s.decodeEnded(cause, p, info, func() { s.failDead(w, info) }) {
		return
	}
	s.writeResult(w, whole(made))
}

type responseUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

type outputText struct {
	Annotations []any  `json:"annotations"`
	Text        string `json:"text"`
	Type        string `json:"type"`
	Logprobs    any    `json:"logprobs"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

// responseObject is vLLM's ResponsesResponse, the members poold and clients
// read.
type responseObject struct {
	ID                string          `json:"id"`
	CreatedAt         int64           `json:"created_at"`
	IncompleteDetails any             `json:"incomplete_details"`
	Model             string          `json:"model"`
	Object            string          `json:"object"`
	Output            []outputMessage `json:"output"`
	ParallelToolCalls bool            `json:"parallel_tool_calls"`
	ToolChoice        string          `json:"tool_choice"`
	Tools             []any           `json:"tools"`
	MaxOutputTokens   *int            `json:"max_output_tokens"`
	Status            string          `json:"status"`
	Usage             *responseUsage  `json:"usage"`
}

// response is the response object of p: with status "in_progress", no
// output and null usage; else the made tokens' message and usage, its
// status "incomplete" when max_output_tokens or /sleep ended it.
func (s *Server) response(p *plan, maxOutput *int, status string, made int) responseObject {
	o := responseObject{ID: p.id, CreatedAt: p.created, Model: s.model, Object: "response", Output: []outputMessage{},
		ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{}, MaxOutputTokens: maxOutput, Status: status}
	if status == "in_progress" {
		return o
	}
	o.Output = []outputMessage{p.responseMessage("completed", string(tokensText(made)))}
	switch p.finish {
	case "length":
		o.Status, o.IncompleteDetails = "incomplete", map[string]string{"reason": "max_output_tokens"}
	case "abort":
		o.Status = "incomplete"
	}
	prompt := len(p.ids)
	o.Usage = &responseUsage{InputTokens: prompt, InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokens: made,
		OutputTokensDetails: map[string]int{"reasoning_tokens": 0}, TotalTokens: prompt + made}
	return o
}

// responseMessage is the output message of p, holding text.
func (p *plan) responseMessage(status, text string) outputMessage {
	m := outputMessage{ID: "msg_" + p.id, Content: []outputText{}, Role: "assistant", Status: status, Type: "message"}
	if status == "completed" {
		m.Content = []outputText{{Annotations: []any{}, Text: text, Type: "output_text"}}
	}
	return m
}

// responseEvent is one event of a Responses stream; the members that an
// event type lacks are left out.
type responseEvent struct {
	ContentIndex   *int            `json:"content_index,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Item           *outputMessage  `json:"item,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Response       *responseObject `json:"response,omitempty"`
	SequenceNumber int             `json:"sequence_number"`
	Text           *string         `json:"text,omitempty"`
	Type           string          `json:"type"`
}

// streamResponse answers a streaming Responses request with vLLM's events:
// response.created and response.in_progress, the message's output item and
// content part, a response.output_text.delta per token, the .done events
// with the whole text, then response.completed with the usage. A request
// that met the core's death ends with vLLM's error event.
func (s *Server) streamResponse(w http.ResponseWriter, q *request, p *plan, info *reqInfo, maxOutput *int) {
	out := newSSE(w, s.eventEnd)
	seq := 0
	send := func(e responseEvent) bool {
		e.SequenceNumber = seq
		seq++
		b, _ := json.Marshal(e)
		return out.named(e.Type, b)
	}
	zero := 0
	item := p.responseMessage("in_progress", "")
	begun := s.response(p, maxOutput, "in_progress", 0)
	if !send(responseEvent{Type: "response.created", Response: &begun}) ||
		!send(responseEvent{Type: "response.in_progress", Response: &begun}) ||
		!send(responseEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &item}) ||
		!send(responseEvent{Type: "response.content_part.added", ContentIndex: &zero, ItemID: item.ID, OutputIndex: &zero,
			Part: &outputText{Annotations: []any{}, Type: "output_text"}}) {
		info.status = 499
		return
	}
	made, cause := s.decode(q, p, func(i int) bool {
		delta := string(appendToken(nil, i))
		return send(responseEvent{Type: "response.output_text.delta", ContentIndex: &zero, Delta: &delta, ItemID: item.ID, OutputIndex: &zero})
	})
	if !s.decodeEnded(cause, p, info, func() { s.failDeadStream(out) }) {
		return
	}
	done := s.response(p, maxOutput, "completed", made)
	text := done.Output[0].Content[0].Text
	send(responseEvent{Type: "response.output_text.done", ContentIndex: &zero, ItemID: item.ID, OutputIndex: &zero, Text: &text})
	send(responseEvent{Type: "response.content_part.done", ContentIndex: &zero, ItemID: item.ID, OutputIndex: &zero, Part: &done.Output[0].Content[0]})
	send(responseEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &done.Output[0]})
	send(responseEvent{Type: "response.completed", Response: &done})
}
