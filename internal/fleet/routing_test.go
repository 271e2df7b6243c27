package fleet

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/poold/poold/internal/statusapi"
)

// A POST under /v1/ goes to the host with its path as the client sent it:
// the mux never cleans it into a redirect, which most clients would follow
// with a GET and lose the body.
func TestPostPathNotRedirected(t *testing.T) {
	awake := newFakeHost(t, "awake", []statusapi.Pool{readyPool("gpu0", "qwen", 0)}, model("chat", "qwen"))
	tf := startFleet(t, Options{}, HandlerOptions{}, awake)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Post(tf.srv.URL+"/v1//chat/completions", "application/json", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != `{"ok":"awake"}` {
		t.Fatalf("%d %s (Location %q), want the host's answer", resp.StatusCode, body, resp.Header.Get("Location"))
	}
	awake.set(func(fh *fakeHost) {
		if len(fh.paths) != 1 || fh.paths[0] != "/v1//chat/completions" {
			t.Errorf("paths at the host: %q", fh.paths)
		}
	})
}
