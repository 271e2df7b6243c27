package enginesim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkChatStream measures a 64-token streamed chat completion end to end over
// loopback HTTP (one request per iteration, in parallel).
func BenchmarkChatStream(b *testing.B) {
	cfg, err := ParseFlags([]string{"m"})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(cfg, nil))
	defer srv.Close()
	ts := srv.URL
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true}}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(ts+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
