package enginesim

import (
	"bytes"
	"context"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// newWhisperServer serves a transcription model as m1, with 4-token answers.
func newWhisperServer(t *testing.T, extra ...string) *httptest.Server {
	t.Helper()
	cfg, err := ParseFlags(append([]string{"/models/whisper-small", "--served-model-name", "m1", "--max-model-len", "100", "--sim-tokens", "4"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewHandler(cfg, nil))
	t.Cleanup(ts.Close)
	return ts
}

// postForm posts a multipart form with an audio file of size bytes.
func postForm(t *testing.T, url string, fields map[string]string, size int) (*http.Response, []byte) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for k, v := range fields {
		_ = mw.WriteField(k, v)
	}
	if size >= 0 {
		fw, _ := mw.CreateFormFile("file", "a.wav")
		_, _ = fw.Write(make([]byte, size))
	}
	mw.Close()
	return doHeader(t, http.MethodPost, url, body.String(), map[string]string{"Content-Type": mw.FormDataContentType()})
}

func TestTranscription(t *testing.T) {
	ts := newWhisperServer(t)
	url := ts.URL + "/v1/audio/transcriptions"
	resp, b := postForm(t, url, map[string]string{"model": "m1"}, 70000)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("json: %d %s", resp.StatusCode, b)
	}
	mustEqualJSON(t, decode(t, b), `{"text":"tok0 tok1 tok2 tok3 ","usage":{"type":"duration","seconds":3}}`)

	resp, b = postForm(t, url, map[string]string{"model": "m1", "response_format": "text"}, 10)
	if resp.StatusCode != http.StatusOK || string(b) != "tok0 tok1 tok2 tok3 " || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("text: %d %q %s", resp.StatusCode, b, resp.Header.Get("Content-Type"))
	}
	_, b = postForm(t, url, map[string]string{"model": "m1", "response_format": "verbose_json"}, 10)
	if m := decode(t, b); m["task"] != "transcribe" || m["duration"] != 1.0 || len(m["segments"].([]any)) != 1 {
		t.Fatalf("verbose_json: %s", b)
	}
	_, b = postForm(t, ts.URL+"/v1/audio/translations", map[string]string{"model": "m1"}, 10)
	mustEqualJSON(t, decode(t, b), `{"text":"tok0 tok1 tok2 tok3 "}`)

	resp, b = postForm(t, url, map[string]string{"model": "m1", "stream": "true", "stream_include_usage": "true", "prompt": "two words"}, 10)
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream: %d %s %s", resp.StatusCode, ct, b)
	}
	events := readEvents(t, bytes.NewReader(b))
	if len(events) != 6 || events[5] != "[DONE]" {
		t.Fatalf("stream events %q", events)
	}
	first := decode(t, []byte(events[0]))
	if !strings.HasPrefix(first["id"].(string), "trsc-") || first["object"] != "transcription.chunk" || first["model"] != "m1" {
		t.Fatalf("first chunk %s", events[0])
	}
	if c := decode(t, []byte(events[3]))["choices"].([]any)[0].(map[string]any); c["finish_reason"] != "stop" || c["delta"].(map[string]any)["content"] != "tok3 " {
		t.Fatalf("last token chunk %s", events[3])
	}
	if u := decode(t, []byte(events[4]))["usage"].(map[string]any); u["prompt_tokens"] != 6.0 || u["completion_tokens"] != 4.0 {
		t.Fatalf("usage chunk %s", events[4])
	}

	for _, tc := range []struct {
		fields map[string]string
		size   int
		status int
	}{
		{map[string]string{"model": "m1"}, -1, http.StatusBadRequest},
		{map[string]string{"model": "nope"}, 10, http.StatusNotFound},
		{map[string]string{"model": "m1", "response_format": "srt"}, 10, http.StatusBadRequest},
		{map[string]string{"model": "m1", "stream_include_usage": "true"}, 10, http.StatusBadRequest},
	} {
		if resp, b := postForm(t, url, tc.fields, tc.size); resp.StatusCode != tc.status {
			t.Errorf("%v: %d %s, want %d", tc.fields, resp.StatusCode, b, tc.status)
		}
	}
}

func TestTranscriptionOpenAIClient(t *testing.T) {
	ts := newWhisperServer(t)
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := client.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{
		Model: "m1",
		File:  openai.File(bytes.NewReader(make([]byte, 40000)), "a.wav", "audio/wav"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Text != "tok0 tok1 tok2 tok3 " || tr.Usage.Seconds != 2 {
		t.Fatalf("transcription: %s", tr.RawJSON())
	}
}
