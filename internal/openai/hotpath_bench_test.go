package openai

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// benchStream is a 64-token vLLM chat stream with include_usage, as poold
// asks for it: every chunk carries "usage":null, the last one the usage.
var benchStream = func() []byte {
	var b strings.Builder
	b.WriteString(evRole)
	for range 64 {
		b.WriteString(evHello)
	}
	b.WriteString(evFinish + evUsage + evDone)
	return []byte(b.String())
}()

// BenchmarkSSEReader passes one stream through, one engine event per Read, as
// an engine's flushes arrive, into ReverseProxy's 32 KiB copy buffer.
func BenchmarkSSEReader(b *testing.B) {
	events := bytes.SplitAfter(benchStream, []byte("\n\n"))
	buf := make([]byte, 32*1024)
	b.SetBytes(int64(len(benchStream)))
	b.ReportAllocs()
	for b.Loop() {
		src := &scriptReader{parts: slicesClone(events)}
		s := NewSSEReader(src, true, nil)
		for {
			_, err := s.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if !s.counted {
			b.Fatal("usage not counted")
		}
	}
}

func slicesClone(parts [][]byte) [][]byte { return append([][]byte(nil), parts...) }

// BenchmarkParseRequest parses and rewrites a typical streaming chat body.
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"qwen-7b","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about GPUs and the patience of people who wait for them."}],"temperature":0.7,"max_tokens":256,"stream":true}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		r, err := parseRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		_ = Rewrite(body, r, Changes{Model: "qwen2.5-7b-instruct", InjectUsage: true})
	}
}
