package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"
)

const weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

// The usage poold records (the access log) is the usage the engine reports,
// for n choices and tool calls, streamed (with the usage the client asked
// for, or with the one poold asks for and withholds) and not, and for an
// audio transcription sent as a multipart form through an alias.
func TestTokenAccounting(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a"}, {Name: "p1", GPUs: []int{1}, Default: "whisper-large-v3"}},
		[]sim{{ID: "a", Pools: []string{"p0"}}, {ID: "whisper-large-v3", Aliases: []string{"stt"}, Pools: []string{"p1"}}}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs := `"messages":[{"role":"user","content":"weather in Paris please"}]`
	for _, tt := range []struct {
		name, path, body string
		completion       int // what the engine reports: every choice's tokens
	}{
		{"n=2", "/v1/chat/completions", `"model":"a","max_tokens":3,"n":2,` + msgs, 6},
		{"tool call", "/v1/chat/completions", `"model":"a","max_tokens":4,"tool_choice":"required",` + weatherTools + `,` + msgs, 4},
		{"n=2 tool calls", "/v1/chat/completions", `"model":"a","max_tokens":2,"n":2,"tool_choice":"required",` + weatherTools + `,` + msgs, 4},
		{"completions n=3", "/v1/completions", `"model":"a","max_tokens":2,"n":3,"prompt":"once upon a time"`, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The engine's report, as a client that asks for it sees it.
			reported := func(body []byte, stream bool) (int, int) {
				p, c := usageOf(t, body, stream)
				if c != tt.completion {
					t.Errorf("the engine reported %d completion tokens, want %d", c, tt.completion)
				}
				return p, c
			}
			code, id, body := d.send(ctx, tt.path, "{"+tt.body+"}", nil)
			if code != http.StatusOK {
				t.Fatalf("%d %s", code, body)
			}
			p, c := reported(body, false)
			checkLogged(t, d, id, p, c)

			code, id, body = d.send(ctx, tt.path, `{"stream":true,"stream_options":{"include_usage":true},`+tt.body+"}", nil)
			if code != http.StatusOK {
				t.Fatalf("stream: %d %s", code, body)
			}
			sp, sc := reported(body, true)
			checkLogged(t, d, id, sp, sc)

			// Without usage asked for, poold asks the engine and withholds it:
			// the same request, so the same report.
			code, id, body = d.send(ctx, tt.path, `{"stream":true,`+tt.body+"}", nil)
			if code != http.StatusOK || strings.Contains(string(body), `"usage":{`) {
				t.Fatalf("stream without usage: %d %s", code, body)
			}
			checkLogged(t, d, id, sp, sc)
		})
	}

	t.Run("transcription form", func(t *testing.T) {
		send := func(fields ...string) (int, string, []byte) {
			var b bytes.Buffer
			w := multipart.NewWriter(&b)
			fw, _ := w.CreateFormFile("file", "a.wav")
			fw.Write(make([]byte, 64000)) // two seconds
			for i := 0; i+1 < len(fields); i += 2 {
				w.WriteField(fields[i], fields[i+1])
			}
			w.Close()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/audio/transcriptions", &b)
			req.Header.Set("Content-Type", w.FormDataContentType())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, resp.Header.Get("X-Request-Id"), body
		}
		// The alias is rewritten inside the form: the engine knows only the id.
		code, id, body := send("model", "stt")
		var text struct{ Text string }
		if code != http.StatusOK || json.Unmarshal(body, &text) != nil || !strings.HasPrefix(text.Text, "tok0 tok1") {
			t.Fatalf("transcription: %d %s", code, body)
		}
		if line := waitLogLine(t, d, id); line["model"] != "stt" || line["profile"] != "whisper-large-v3" || line["stream"] != false {
			t.Errorf("access log %v", line)
		}
		code, id, body = send("model", "stt", "stream", "true", "stream_include_usage", "true")
		if code != http.StatusOK {
			t.Fatalf("streamed transcription: %d %s", code, body)
		}
		p, c := usageOf(t, body, true)
		line := checkLogged(t, d, id, p, c)
		if line["stream"] != true || c == 0 {
			t.Errorf("access log %v of a stream of %d tokens", line, c)
		}
		if code, _, body := send("stream", "true"); code != http.StatusBadRequest || !strings.Contains(string(body), `the form field \"model\" is required`) {
			t.Errorf("a form without a model: %d %s", code, body)
		}
	})
}

// checkLogged waits for request id's access-log line and checks that it
// holds the engine's usage, prompt and completion tokens, not an estimate.
func checkLogged(t *testing.T, d *daemon, id string, prompt, completion int) map[string]any {
	t.Helper()
	line := waitLogLine(t, d, id)
	if got := fmt.Sprint(line["prompt_tokens"], " ", line["completion_tokens"], " ", line["tokens_estimated"]); got != fmt.Sprint(prompt, " ", completion, " false") {
		t.Errorf("request %s: logged tokens %s, want %d %d false (the engine's)", id, got, prompt, completion)
	}
	return line
}
