package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// audioBytesPerSecond sizes the simulated audio: 16 kHz 16-bit mono PCM.
const audioBytesPerSecond = 32000

// decoderPrompt is the ids of a Whisper decoder's start tokens
// (<|startoftranscript|>, language, task, <|notimestamps|>), which every
// transcription's prompt holds.
var decoderPrompt = []int{50258, 50259, 50360, 50364}

func (s *Server) handleTranscription(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	s.handleAudio(w, r, info, "transcribe")
}

func (s *Server) handleTranslation(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	s.handleAudio(w, r, info, "translate")
}

// handleAudio serves /v1/audio/transcriptions (task "transcribe") and
// /v1/audio/translations ("translate"): a multipart form with model, file,
// and optional prompt, response_format (json, text or verbose_json), stream,
// stream_include_usage and stream_continuous_usage_stats. The audio lasts a
// second per 32,000 bytes of file (at least one); the text is --sim-tokens
// tokens. A transcription's json answer reports that duration as usage, as
// vLLM does.
func (s *Server) handleAudio(w http.ResponseWriter, r *http.Request, info *reqInfo, task string) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := r.ParseMultipartForm(8 << 20); err != nil {
		badRequest(w, info, fmt.Sprintf("failed to read the multipart form: %v", err))
		return
	}
	defer r.MultipartForm.RemoveAll()
	file, header, err := r.FormFile("file")
	if err != nil {
		badRequest(w, info, "Field required: file")
		return
	}
	file.Close()
	model := r.FormValue("model")
	if !s.resolveModel(w, info, &model) {
		return
	}
	format := r.FormValue("response_format")
	switch format {
	case "":
		format = "json"
	case "json", "text", "verbose_json":
	default:
		badRequest(w, info, fmt.Sprintf("response_format: unsupported value %q (use json, text or verbose_json)", format))
		return
	}
	flag := func(name string) bool { b, _ := strconv.ParseBool(r.FormValue(name)); return b }
	p := plan{
		created: time.Now().Unix(), ids: slices.Concat(decoderPrompt, tokenize(r.FormValue("prompt"))),
		completion: s.cfg.Tokens, n: 1, finish: "stop",
		stream: flag("stream"), usage: flag("stream_include_usage"),
	}
	p.contUsage = p.usage && flag("stream_continuous_usage_stats")
	if (p.usage || flag("stream_continuous_usage_stats")) && !p.stream {
		badRequest(w, info, "Stream options can only be defined when `stream=True`.")
		return
	}
	seconds := max(1, int((header.Size+audioBytesPerSecond-1)/audioBytesPerSecond))
	object := "transcription.chunk"
	p.id = "trsc-" + info.id
	if task == "translate" {
		p.id, object = "trsl-"+info.id, "translation.chunk"
	}
	q, ok := s.admit(w, r, info, p.ids)
	if !ok {
		return
	}
	defer q.done()
	if p.stream {
		s.streamAudio(w, q, &p, info, object)
		return
	}
	made, cause := s.decode(q, &p, func(int) bool { return true })
	switch {
	case errors.Is(cause, errCoreDead):
		s.failDead(w, info)
		return
	case cause != nil && !errors.Is(cause, errSleepAbort):
		info.status = 499
		return
	}
	text := string(tokensText(made))
	var resp any
	switch {
	case format == "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(text))
		return
	case format == "verbose_json":
		resp = map[string]any{
			"task": task, "language": "en", "duration": float64(seconds), "text": text,
			"segments": []map[string]any{{
				"id": 0, "seek": 0, "start": 0.0, "end": float64(seconds), "text": text, "tokens": tokenize(text),
				"temperature": 0.0, "avg_logprob": -0.1, "compression_ratio": 1.0, "no_speech_prob": 0.0,
			}},
		}
	case task == "translate":
		resp = map[string]any{"text": text}
	default:
		resp = map[string]any{"text": text, "usage": map[string]any{"type": "duration", "seconds": seconds}}
	}
	b, _ := json.Marshal(resp)
	s.writeResult(w, b)
}

func tokensText(n int) []byte {
	b := make([]byte, 0, n*7)
	for i := range n {
		b = appendToken(b, i)
	}
	return b
}

type audioDelta struct {
	Content string `json:"content"`
}

type audioChoice struct {
	Delta        audioDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
	StopReason   any        `json:"stop_reason"`
}

type audioChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []audioChoice `json:"choices"`
	Usage   *usageInfo    `json:"usage,omitempty"`
}

// streamAudio streams a transcription or translation in vLLM's chunks: one
// per token, then a usage chunk when asked for, then [DONE].
func (s *Server) streamAudio(w http.ResponseWriter, q *request, p *plan, info *reqInfo, object string) {
	out := newSSE(w, s.eventEnd)
	prompt := len(p.ids)
	usage := func(completion int) *usageInfo {
		return &usageInfo{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	}
	send := func(c audioChunk) bool {
		b, _ := json.Marshal(c)
		return out.send(append([]byte("data: "), b...))
	}
	chunk := audioChunk{ID: p.id, Object: object, Created: p.created, Model: s.model}
	made, cause := s.decode(q, p, func(i int) bool {
		c := chunk
		ch := audioChoice{Delta: audioDelta{Content: string(appendToken(nil, i))}}
		if i == p.completion-1 {
			ch.FinishReason = &p.finish
		}
		c.Choices = []audioChoice{ch}
		if p.contUsage {
			c.Usage = usage(i + 1)
		}
		return send(c)
	})
	switch {
	case errors.Is(cause, errCoreDead):
		s.failDeadStream(out)
		return
	case cause != nil && !errors.Is(cause, errSleepAbort):
		info.status = 499
		return
	}
	if p.usage {
		c := chunk
		c.Choices, c.Usage = []audioChoice{}, usage(made)
		send(c)
	}
	out.done()
}
