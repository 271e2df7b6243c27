package enginesim

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// sse writes server-sent events, each "data: <payload>" (after an
// "event: <name>" line for a named one) and the server's event end
// (--sim-sse-newline), flushing after each.
type sse struct {
	w       http.ResponseWriter
	flusher http.Flusher
	end     string
	failed  bool // a write failed: the client is gone
}

func newSSE(w http.ResponseWriter, end string) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	if f != nil {
		f.Flush()
	}
	return &sse{w: w, flusher: f, end: end}
}

// send writes b, a whole event without its end, and reports success.
func (e *sse) send(b []byte) bool {
	if e.failed {
		return false
	}
	b = append(b, e.end...)
	if _, err := e.w.Write(b); err != nil {
		e.failed = true
		return false
	}
	if e.flusher != nil {
		e.flusher.Flush()
	}
	return true
}

// named writes an event named name (the Responses and Messages APIs name
// each event by its type) whose data is data, and reports success.
func (e *sse) named(name string, data []byte) bool {
	nl := e.end[:len(e.end)/2]
	b := make([]byte, 0, len("event: ")+len(name)+len(nl)+len("data: ")+len(data)+len(e.end))
	b = append(append(append(append(append(b, "event: "...), name...), nl...), "data: "...), data...)
	return e.send(b)
}

func (e *sse) done() { e.send([]byte("data: [DONE]")) }

// errorEvent sends vLLM's in-stream error event.
func (e *sse) errorEvent(status int, typ, msg string) {
	b, _ := json.Marshal(errorOf(status, typ, "", msg))
	e.send(append([]byte("data: "), b...))
}

// chunks builds the chunks of one streamed generation, appending to one
// buffer: the constant head of every chunk is rendered once.
type chunks struct {
	s    *Server
	p    *plan
	head []byte // `data: {"id":…,"choices":[`
	buf  []byte
}

func newChunks(s *Server, p *plan) *chunks {
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
	return &chunks{s: s, p: p, head: head, buf: make([]byte, 0, len(head)+200)}
}

// chunk is a chunk with one choice, which choice appends, and the usage of
// completion tokens (per choice) when continuous usage is on.
func (c *chunks) chunk(choice func([]byte) []byte, completion int) []byte {
	c.buf = choice(append(c.buf[:0], c.head...))
	c.buf = append(c.buf, ']')
	switch {
	case c.p.contUsage:
		c.buf = c.appendUsage(c.buf, completion)
	case c.s.cfg.UsageNull:
		c.buf = append(c.buf, `,"usage":null`...)
	}
	return append(c.buf, '}')
}

// usage is the final usage-only chunk.
func (c *chunks) usage(completion int) []byte {
	c.buf = append(append(c.buf[:0], c.head...), ']')
	c.buf = c.appendUsage(c.buf, completion)
	return append(c.buf, '}')
}

func (c *chunks) appendUsage(b []byte, completion int) []byte {
	prompt := len(c.p.ids)
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	return append(b, '}')
}

func appendIndex(b []byte, choice int) []byte {
	b = append(b, `{"index":`...)
	return strconv.AppendInt(b, int64(choice), 10)
}

// role is the first chunk of a chat choice.
func (c *chunks) role(choice int) []byte {
	return c.chunk(func(b []byte) []byte {
		return append(appendIndex(b, choice), `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
	}, 0)
}

// token is the chunk of token i of a choice.
func (c *chunks) token(choice, i int) []byte {
	p := c.p
	last := i == p.completion-1
	return c.chunk(func(b []byte) []byte {
		b = appendIndex(b, choice)
		switch {
		case p.tool != nil:
			b = append(b, `,"delta":{"tool_calls":[{"index":0,`...)
			if i == 0 {
				b = append(b, `"id":"`...)
				b = append(b, p.tool.id...)
				b = append(b, `","type":"function","function":{"name":`...)
				name, _ := json.Marshal(p.tool.name)
				b = append(b, name...)
				b = append(b, ',')
			} else {
				b = append(b, `"function":{`...)
			}
			args, _ := json.Marshal(p.tool.piece(i, p.completion))
			b = append(b, `"arguments":`...)
			b = append(b, args...)
			b = append(b, `}}]},"logprobs":null,"finish_reason":`...)
		case p.chat:
			b = append(b, `,"delta":{"content":"`...)
			b = appendToken(b, i)
			b = append(b, `"},"logprobs":null,"finish_reason":`...)
		default:
			b = append(b, `,"text":"`...)
			b = appendToken(b, i)
			b = append(b, `","logprobs":null,"finish_reason":`...)
		}
		switch {
		case last:
			b = append(b, '"')
			b = append(b, p.finish...)
			b = append(b, `","stop_reason":null}`...)
		case p.chat:
			b = append(b, `null}`...)
		default:
			b = append(b, `null,"stop_reason":null}`...)
		}
		return b
	}, i+1)
}

// aborted is the last chunk of a choice that /sleep aborted.
func (c *chunks) aborted(choice, made int) []byte {
	return c.chunk(func(b []byte) []byte {
		b = appendIndex(b, choice)
		if c.p.chat {
			b = append(b, `,"delta":{}`...)
		} else {
			b = append(b, `,"text":""`...)
		}
		return append(b, `,"logprobs":null,"finish_reason":"abort","stop_reason":null}`...)
	}, made)
}

// stream answers a streaming request with server-sent events: for chat, a
// role chunk per choice, then a chunk per token and choice, then the usage
// chunk when asked for, then [DONE]. A request that /sleep aborted ends with
// a finish_reason "abort" chunk per choice; one that met the core's death
// ends with an error event.
func (s *Server) stream(w http.ResponseWriter, q *request, p *plan, info *reqInfo) {
	out := newSSE(w, s.eventEnd)
	c := newChunks(s, p)
	rolesSent := !p.chat
	roles := func() bool {
		for i := 0; !rolesSent && i < p.n; i++ {
			if !out.send(c.role(i)) {
				return false
			}
		}
		rolesSent = true
		return true
	}
	made, cause := s.decode(q, p, func(i int) bool {
		if !roles() {
			return false
		}
		for choice := range p.n {
			if !out.send(c.token(choice, i)) {
				return false
			}
		}
		return true
	})
	switch {
	case errors.Is(cause, errCoreDead):
		s.failDeadStream(out)
		return
	case isAbort(cause):
		roles()
		for choice := range p.n {
			out.send(c.aborted(choice, made))
		}
	case cause != nil:
		info.status = 499
		return
	}
	if p.usage {
		out.send(c.usage(p.n * made))
	}
	out.done()
}

// failDeadStream ends a stream that met the core's death as vLLM does: an
// error event, then [DONE].
func (s *Server) failDeadStream(out *sse) {
	s.noteDead()
	out.errorEvent(http.StatusInternalServerError, "InternalServerError", errCoreDead.Error())
	out.done()
}
