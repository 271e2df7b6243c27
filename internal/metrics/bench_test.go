package metrics

import (
	"log/slog"
	"testing"
	"time"

	"github.com/poold/poold/internal/record"
)

// The per-request cost of the metrics and the client classification, to set
// against a proxied request's own cost (tens of microseconds on loopback).

func BenchmarkObserve(b *testing.B) {
	_, m := newLoaded(b, twoGPUs)
	rec := &record.Request{RequestID: "r", Pool: "gpu0", Model: "chat", Profile: "qwen", Client: "team-a", Status: 200, Stream: true,
		Counted: true, PromptTokens: 12, CompletionTokens: 34, QueueWait: time.Millisecond, TTFB: 20 * time.Millisecond, Duration: time.Second,
		TTFT: 25 * time.Millisecond, ITLGaps: 33, ITLP50: 20 * time.Millisecond, ITLMax: 90 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(rec)
	}
}

func BenchmarkAccessLog(b *testing.B) {
	log := slog.New(slog.NewJSONHandler(discard{}, nil))
	rec := &record.Request{RequestID: "r", Pool: "gpu0", Model: "chat", Profile: "qwen", Client: "team-a", Status: 200, Stream: true,
		Counted: true, PromptTokens: 12, CompletionTokens: 34, QueueWait: time.Millisecond, TTFB: 20 * time.Millisecond, Duration: time.Second,
		TTFT: 25 * time.Millisecond, ITLGaps: 33, ITLP50: 20 * time.Millisecond, ITLMax: 90 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		rec.Log(log)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
