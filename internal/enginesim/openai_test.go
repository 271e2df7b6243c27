package enginesim

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func TestOpenAIClient(t *testing.T) {
	_, ts := newTestServer(t)
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "m1",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there world")},
		MaxTokens: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(chat.Choices) != 1 || chat.Choices[0].Message.Content != "tok0 tok1 " || chat.Choices[0].FinishReason != "length" ||
		chat.Usage.PromptTokens != 3 || chat.Usage.CompletionTokens != 2 || chat.Usage.TotalTokens != 5 {
		t.Fatalf("chat: %s", chat.RawJSON())
	}

	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "m2",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "tok0 tok1 tok2 tok3 " || acc.Choices[0].FinishReason != "stop" ||
		acc.Usage.PromptTokens != 1 || acc.Usage.CompletionTokens != 4 || acc.Usage.TotalTokens != 5 {
		t.Fatalf("accumulated stream: %+v", acc.ChatCompletion)
	}

	cmpl, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "m1",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")},
		MaxTokens: openai.Int(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmpl.Choices) != 1 || cmpl.Choices[0].Text != "tok0 " || cmpl.Usage.PromptTokens != 2 || cmpl.Usage.CompletionTokens != 1 {
		t.Fatalf("completion: %s", cmpl.RawJSON())
	}

	cstream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     "m1",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")},
		MaxTokens: openai.Int(3),
	})
	text := ""
	for cstream.Next() {
		c := cstream.Current()
		if len(c.Choices) == 1 {
			text += c.Choices[0].Text
		}
	}
	if err := cstream.Err(); err != nil || text != "tok0 tok1 tok2 " {
		t.Fatalf("completion stream: %q, %v", text, err)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type != "NotFoundError" || apiErr.Param != "model" {
		t.Fatalf("unknown model: %v", err)
	}

	// Embeddings, from a pooling model.
	_, pts := newTestServer(t, "--runner", "pooling")
	client = openai.NewClient(option.WithBaseURL(pts.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model:          "m2",
		Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", "b c"}},
		EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Data) != 2 || len(emb.Data[1].Embedding) != embeddingDim || emb.Data[1].Index != 1 || emb.Usage.PromptTokens != 3 {
		t.Fatalf("embeddings: %s", emb.RawJSON())
	}

}
