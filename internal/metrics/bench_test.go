package metrics

import (
	"log/slog"
	"net/http"
	"testing"
	"time"
)

// The per-request cost of the metrics and the client classification, to set
// against a proxied request's own cost (tens of microseconds on loopback).

func BenchmarkObserve(b *testing.B) {
	_, m := newLoaded(b, twoGPUs)
	rec := &Record{RequestID: "r", Pool: "gpu0", Model: "chat", Profile: "qwen", Client: "team-a", Status: 200, Stream: true,
		Counted: true, PromptTokens: 12, CompletionTokens: 34, QueueWait: time.Millisecond, TTFB: 20 * time.Millisecond, Duration: time.Second,
		TTFT: 25 * time.Millisecond, ITLGaps: 33, ITLP50: 20 * time.Millisecond, ITLMax: 90 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(rec)
	}
}

func BenchmarkAccessLog(b *testing.B) {
	log := slog.New(slog.NewJSONHandler(discard{}, nil))
	rec := &Record{RequestID: "r", Pool: "gpu0", Model: "chat", Profile: "qwen", Client: "team-a", Status: 200, Stream: true,
		Counted: true, PromptTokens: 12, CompletionTokens: 34, QueueWait: time.Millisecond, TTFB: 20 * time.Millisecond, Duration: time.Second,
		TTFT: 25 * time.Millisecond, ITLGaps: 33, ITLP50: 20 * time.Millisecond, ITLMax: 90 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		rec.Log(log)
	}
}

func BenchmarkClassify(b *testing.B) {
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = "sk-key-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	c, err := NewClients(ClientConfig{Header: "X-Client", Classes: map[string]ClientClass{"team-a": {Keys: keys}}})
	if err != nil {
		b.Fatal(err)
	}
	h := http.Header{"Authorization": {"Bearer " + keys[17]}}
	b.ReportAllocs()
	for b.Loop() {
		if c.Classify(h) != "team-a" {
			b.Fatal("misclassified")
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
