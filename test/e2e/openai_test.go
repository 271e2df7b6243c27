package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// The official openai-go client works unchanged against poold: chat and
// completions, streamed or not, models.retrieve, a tool call and its answer,
// an audio transcription (a multipart form, through an alias) and
// embeddings. A client that did not ask for usage never receives a usage
// chunk, yet poold counts its tokens.
func TestOpenAIClient(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "chat", GPUs: []int{0}, Default: "qwen"}, {Name: "embed", GPUs: []int{1}, Default: "bge"}, {Name: "audio", GPUs: []int{2}, Default: "whisper-large-v3"}},
		[]sim{
			{ID: "qwen", Aliases: []string{"chat-model"}, Pools: []string{"chat"}},
			{ID: "bge", Pools: []string{"embed"}},
			{ID: "whisper-large-v3", Aliases: []string{"whisper-1"}, Pools: []string{"audio"}},
		}, nil))
	for _, p := range []string{"chat", "embed", "audio"} {
		d.waitPool(p, 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	}

	client := openai.NewClient(option.WithBaseURL(d.url+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two three four")}
	tokens := func() (float64, float64) {
		return d.metricValue(`poold_prompt_tokens_total{client="none",pool="chat",profile="qwen"}`),
			d.metricValue(`poold_completion_tokens_total{client="none",pool="chat",profile="qwen"}`)
	}

	t.Run("chat non-streaming", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat-model", Messages: msgs, MaxTokens: openai.Int(5)})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Model != "qwen" || resp.Choices[0].Message.Content != "tok0 tok1 tok2 tok3 tok4 " || resp.Usage.PromptTokens != 4 || resp.Usage.CompletionTokens != 5 {
			t.Fatalf("unexpected response: %+v", resp)
		}
	})

	t.Run("chat streaming without usage", func(t *testing.T) {
		p0, c0 := tokens()
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: msgs, MaxTokens: openai.Int(7)})
		var content string
		for stream.Next() {
			chunk := stream.Current()
			if len(chunk.Choices) == 0 || chunk.Usage.TotalTokens != 0 || chunk.JSON.Usage.Valid() {
				t.Fatalf("client that did not ask for usage got a usage chunk: %s", chunk.RawJSON())
			}
			content += chunk.Choices[0].Delta.Content
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if content != "tok0 tok1 tok2 tok3 tok4 tok5 tok6 " {
			t.Fatalf("content %q", content)
		}
		// poold counted the tokens all the same.
		waitMetric(t, func() bool { p, c := tokens(); return p == p0+4 && c == c0+7 })
	})

	t.Run("chat streaming with usage", func(t *testing.T) {
		p0, c0 := tokens()
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: "qwen", Messages: msgs, MaxTokens: openai.Int(3),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var usageChunks int
		var usage openai.CompletionUsage
		for stream.Next() {
			chunk := stream.Current()
			if len(chunk.Choices) == 0 {
				usageChunks++
				usage = chunk.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if usageChunks != 1 || usage.PromptTokens != 4 || usage.CompletionTokens != 3 {
			t.Fatalf("usage chunks %d, usage %+v", usageChunks, usage)
		}
		waitMetric(t, func() bool { p, c := tokens(); return p == p0+4 && c == c0+3 })
	})

	t.Run("completions", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: "qwen", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")}, MaxTokens: openai.Int(2),
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Choices[0].Text != "tok0 tok1 " || resp.Usage.CompletionTokens != 2 {
			t.Fatalf("unexpected completion: %+v", resp)
		}
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model: "qwen", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")}, MaxTokens: openai.Int(3),
		})
		var text string
		for stream.Next() {
			c := stream.Current()
			if len(c.Choices) == 0 {
				t.Fatalf("usage chunk leaked to the client: %s", c.RawJSON())
			}
			text += c.Choices[0].Text
		}
		if err := stream.Err(); err != nil || text != "tok0 tok1 tok2 " {
			t.Fatalf("streamed completion %q, %v", text, err)
		}
	})

	t.Run("models retrieve", func(t *testing.T) {
		// qwen is loaded: its engine (the simulator, 4096 by default) gives
		// max_model_len; chat-model is its alias.
		for _, id := range []string{"qwen", "chat-model"} {
			m, err := client.Models.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			var extra struct {
				Root        string `json:"root"`
				State       string `json:"state"`
				MaxModelLen int    `json:"max_model_len"`
			}
			if err := json.Unmarshal([]byte(m.RawJSON()), &extra); err != nil {
				t.Fatal(err)
			}
			if m.ID != id || m.Object != "model" || m.OwnedBy != "poold" || extra.Root != "qwen" || extra.State != "ready" || extra.MaxModelLen != 4096 {
				t.Errorf("Models.Get(%s): %s", id, m.RawJSON())
			}
		}
		_, err := client.Models.Get(ctx, "no-such-model")
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Errorf("Models.Get of an unknown model: %v", err)
		}
	})

	t.Run("tool call round trip", func(t *testing.T) {
		params := openai.ChatCompletionNewParams{
			Model:     "chat-model",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather in Paris?")},
			MaxTokens: openai.Int(3),
			Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
				Name:       "get_weather",
				Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
			})},
			ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
		}
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		calls := acc.Choices[0].Message.ToolCalls
		if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city": "tok0 tok1 tok2 "}` || acc.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("streamed tool call: %+v", acc.ChatCompletion)
		}
		// The tool's answer goes back; the model answers in words.
		params.Messages = append(params.Messages, acc.Choices[0].Message.ToParam(), openai.ToolMessage(`{"temperature": 21}`, calls[0].ID))
		params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
		resp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if m := resp.Choices[0].Message; len(m.ToolCalls) != 0 || m.Content != "tok0 tok1 tok2 " || resp.Choices[0].FinishReason != "length" || resp.Model != "qwen" {
			t.Fatalf("answer after the tool's result: %s", resp.RawJSON())
		}
	})

	t.Run("audio transcription", func(t *testing.T) {
		// whisper-1 is an alias: poold rewrites it inside the form.
		resp, err := client.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{
			Model: "whisper-1",
			File:  openai.File(bytes.NewReader(make([]byte, 64000)), "a.wav", "audio/wav"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(resp.Text, "tok0 tok1 ") {
			t.Fatalf("transcription: %s", resp.RawJSON())
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		resp, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "bge", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Data) != 2 || len(resp.Data[0].Embedding) == 0 || resp.Usage.PromptTokens != 3 {
			t.Fatalf("unexpected embeddings: %+v", resp)
		}
		waitMetric(t, func() bool {
			return d.metricValue(`poold_prompt_tokens_total{client="none",pool="embed",profile="bge"}`) == 3
		})
	})
}

func waitMetric(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("metric not reached within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
