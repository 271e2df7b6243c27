package openai

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// chatResponse is a non-streaming vLLM chat response whose content is about
// contentLen bytes, serialized compactly or, with spaced, as Python's
// json.dumps does by default.
func chatResponse(contentLen int, spaced bool, tailExtra string) []byte {
	content := strings.Repeat("The quick brown \"fox\" jumps; usage: {}. ", contentLen/40+1)
	s := `{"id":"chatcmpl-42","object":"chat.completion","created":1718000000,"model":"qwen","choices":[{"index":0,"message":{"role":"assistant","content":` +
		mustJSON(content) + `,"refusal":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
		`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1234,"total_tokens":21234,"completion_tokens":20000,"prompt_tokens_details":null},` +
		`"prompt_logprobs":` + tailExtra + `,"kv_transfer_params":null}`
	if spaced {
		s = strings.NewReplacer(`":`, `": `, `,"`, `, "`).Replace(s)
	}
	return []byte(s)
}

func TestUsageReaderClose(t *testing.T) {
	src := &scriptReader{}
	if err := (NewUsageReader(src, nil)).Close(); err != nil || !src.closed {
		t.Fatalf("Close did not close the source")
	}
}

// longPromptResponse is a chat response to a long prompt that asked for
// prompt_logprobs and prompt_token_ids: vLLM puts them after the usage,
// megabytes of them.
func longPromptResponse(tokens int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`)
	b.WriteString(`"usage":{"prompt_tokens":` + itoa(tokens) + `,"total_tokens":` + itoa(tokens+1) + `,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":[null`)
	for i := 1; i < tokens; i++ {
		b.WriteString(`,{"` + itoa(i) + `":{"logprob":-0.5,"rank":1,"decoded_token":"usage"}}`)
	}
	b.WriteString(`],"prompt_token_ids":[`)
	for i := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(itoa(i))
	}
	b.WriteString(`],"kv_transfer_params":{"usage":{"prompt_tokens":1}}}`)
	return b.Bytes()
}

func TestUsageReader(t *testing.T) {
	want := Usage{PromptTokens: 1234, CompletionTokens: 20000}
	tests := []struct {
		name  string
		body  []byte
		want  Usage
		found bool
	}{
		{"compact", chatResponse(70*1024, false, "null"), want, true},
		{"spaced", chatResponse(70*1024, true, "null"), want, true},
		{"small", chatResponse(10, false, "null"), want, true},
		{"usage string after usage key", chatResponse(70*1024, false,
			`[null,{"8207":{"logprob":-1.5,"rank":1,"decoded_token":"usage"}}]`), want, true},
		{"usage early, megabytes after it", longPromptResponse(40_000), Usage{PromptTokens: 40_000, CompletionTokens: 1}, true},
		{"usage null", []byte(`{"object":"list","data":[],"usage":null}`), Usage{}, false},
		{"no usage", []byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`), Usage{}, false},
		{"usage only in content", []byte(`{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":3}"}}]}`), Usage{}, false},
		{"usage only nested", []byte(`{"data":[{"usage":{"prompt_tokens":3}}],"x":{"usage":{"prompt_tokens":4}}}`), Usage{}, false},
		{"usage as a value", []byte(`{"kind":"usage","n":{"prompt_tokens":3}}`), Usage{}, false},
		{"escaped quotes before it", []byte(`{"a":"x\\\"usage\"\\","usage":{"prompt_tokens":5}}`), Usage{PromptTokens: 5}, true},
		{"usage too large to be one", append(append([]byte(`{"usage":{"prompt_tokens":1,"pad":"`), bytes.Repeat([]byte("z"), maxUsageValue)...), `"}}`...), Usage{}, false},
		{"embeddings", []byte(`{"id":"embd-1","object":"list","created":1,"model":"e5","data":[{"index":0,"object":"embedding","embedding":[0.1,-0.2]}],"usage":{"prompt_tokens":8,"total_tokens":8,"completion_tokens":0,"prompt_tokens_details":null}}`),
			Usage{PromptTokens: 8}, true},
		{"responses", []byte(`{"id":"resp_1","created_at":1,"model":"m","object":"response","output":[{"id":"msg_1","content":[{"annotations":[],"text":"\"usage\": {}","type":"output_text"}],"role":"assistant","status":"completed","type":"message"}],` +
			`"max_output_tokens":16,"status":"completed","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":16,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":25},"user":null}`),
			Usage{PromptTokens: 9, CompletionTokens: 16}, true},
		{"messages", []byte(`{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"model":"m","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":4}}`),
			Usage{PromptTokens: 9, CompletionTokens: 4}, true},
		{"rerank", []byte(`{"id":"rerank-1","model":"r","usage":{"prompt_tokens":12,"total_tokens":12},"results":[{"index":0,"document":{"text":"a"},"relevance_score":0.5}]}`),
			Usage{PromptTokens: 12}, true},
		{"rerank, total tokens only (older vLLM)", []byte(`{"id":"rerank-1","model":"r","usage":{"total_tokens":12},"results":[]}`), Usage{PromptTokens: 12}, true},
		{"a transcription's duration", []byte(`{"text":"hello","usage":{"type":"duration","seconds":3}}`), Usage{}, false},
		{"a top-level array", []byte(`[{"usage":{"prompt_tokens":8}}]`), Usage{}, false},
		{"not JSON", []byte(`Internal Server Error: "usage": {`), Usage{}, false},
		{"cut short", []byte(`{"usage":{"prompt_tokens":8}`), Usage{}, false},
		{"empty", nil, Usage{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			readers := map[string]func() io.Reader{
				"whole":    func() io.Reader { return bytes.NewReader(tt.body) },
				"odd":      func() io.Reader { return &scriptReader{parts: chunks(bytes.Clone(tt.body), 4093)} },
				"halves":   func() io.Reader { return iotest.HalfReader(bytes.NewReader(tt.body)) },
				"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(tt.body)) },
			}
			for how, src := range readers {
				firsts := 0
				ur := NewUsageReader(io.NopCloser(src()), func() { firsts++ })
				got, err := readAll(ur, 32*1024)
				if err != io.EOF {
					t.Fatalf("%s: err %v", how, err)
				}
				if !bytes.Equal(got, tt.body) {
					t.Fatalf("%s: body changed", how)
				}
				if cap(ur.scan.value) > maxUsageValue || cap(ur.scan.key) > 16 {
					t.Fatalf("%s: holds %d bytes of value, %d of key", how, cap(ur.scan.value), cap(ur.scan.key))
				}
				if u, ok := ur.Usage(); u != tt.want || ok != tt.found {
					t.Fatalf("%s: Usage() = %+v, %v; want %+v, %v", how, u, ok, tt.want, tt.found)
				}
				if firsts != min(1, len(tt.body)) {
					t.Fatalf("%s: onFirst called %d times", how, firsts)
				}
			}
		})
	}
}

// A JSON body cut short (an engine that promised more than it sent) is
// reported by the UsageReader.
func TestUsageReaderCut(t *testing.T) {
	ur := NewUsageReader(&scriptReader{parts: [][]byte{[]byte(`{"usage":`)}, err: io.ErrUnexpectedEOF}, nil)
	if _, err := io.ReadAll(ur); err != io.ErrUnexpectedEOF || ur.Err() != io.ErrUnexpectedEOF || ur.Ended() {
		t.Fatalf("read %v, Err %v, Ended %v", err, ur.Err(), ur.Ended())
	}
	whole := NewUsageReader(io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":1}}`)), nil)
	if _, err := io.ReadAll(whole); err != nil || whole.Err() != nil || !whole.Ended() {
		t.Fatalf("a whole body: read %v, Err %v, Ended %v", err, whole.Err(), whole.Ended())
	}
}

// BenchmarkUsageReader passes a 70 KiB plain chat answer through into
// ReverseProxy's 32 KiB copy buffer.
func BenchmarkUsageReader(b *testing.B) {
	body := chatResponse(70*1024, false, "null")
	buf := make([]byte, 32*1024)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		ur := NewUsageReader(io.NopCloser(bytes.NewReader(body)), nil)
		for {
			_, err := ur.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if _, ok := ur.Usage(); !ok {
			b.Fatal("usage not found")
		}
	}
}
