package main

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"

	"github.com/poold/poold/internal/pool"
)

// logHandler is the daemon log's handler: JSON lines for format "json",
// else the text format of textHandler.
func logHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	out := &lockedWriter{w: w}
	return &textHandler{Handler: slog.NewTextHandler(out, opts), out: out}
}

// textHandler is slog's text format, but for engine output (records of
// message pool.EngineOutput), which it prints as the engine wrote it, after
// the time and the engine's pool, profile and pid:
//
//	time=2026-11-30T13:13:33.427Z pool=gpu0 profile=qwen pid=4242 | INFO 11-30 13:13:33 loader.py:12] Loading weights
//
// Control characters in the line (but tabs) are written as \xNN, so that an
// engine cannot forge or garble the lines around its own.
type textHandler struct {
	slog.Handler               // slog's text handler, for every other record
	out          *lockedWriter // shared with the slog handler
	attrs        []slog.Attr   // given through WithAttrs
}

func (h *textHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != pool.EngineOutput {
		return h.Handler.Handle(ctx, r)
	}
	b := r.Time.AppendFormat([]byte("time="), "2006-01-02T15:04:05.000Z07:00")
	var line string
	found := false
	add := func(a slog.Attr) bool {
		switch a.Key {
		case pool.EngineLine:
			line, found = a.Value.String(), true
		case "pool", "profile", "pid":
			b = append(b, ' ')
			b = append(b, a.Key...)
			b = append(b, '=')
			b = append(b, a.Value.String()...)
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if !found {
		return h.Handler.Handle(ctx, r)
	}
	b = appendPrintable(append(b, " | "...), line)
	_, err := h.out.Write(append(b, '\n'))
	return err
}

func (h *textHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &textHandler{Handler: h.Handler.WithAttrs(attrs), out: h.out, attrs: append(slices.Clip(h.attrs), attrs...)}
}

// WithGroup leaves the records of a group to slog's text handler: engine
// output is never logged in one.
func (h *textHandler) WithGroup(name string) slog.Handler { return h.Handler.WithGroup(name) }

// appendPrintable appends s with its control characters, tabs aside,
// written as \xNN.
func appendPrintable(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 && c != '\t' || c == 0x7f {
			b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return b
}

// lockedWriter makes the writes of several handlers to one destination
// whole lines each.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
