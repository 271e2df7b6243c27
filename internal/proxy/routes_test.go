package proxy

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

func TestRouteOf(t *testing.T) {
	cases := []struct {
		uri  string
		want route
		ok   bool
	}{
		{"/v1/chat/completions", route{"", "/v1/chat/completions"}, true},
		{"/v1/completions?x=1", route{"", "/v1/completions"}, true},
		{"/pools/gpu0/v1/embeddings", route{"gpu0", "/v1/embeddings"}, true},
		{"/tokenize", route{"", "/tokenize"}, true},
		{"/pools/gpu0/rerank", route{"gpu0", "/rerank"}, true},
		{"/v2/rerank", route{"", "/v2/rerank"}, true},
		{"/pools/gpu0/v1/messages", route{"gpu0", "/v1/messages"}, true},
		{"/v1/%63hat/completions", route{"", "/v1/chat/completions"}, true}, // decoded once, no slash in it
		// The attacks: dot-segments, encoded or not, and encoded slashes.
		{"/v1/%2e%2e/sleep?level=1", route{}, false},
		{"/v1/..%2fcollective_rpc", route{}, false},
		{"/pools/gpu0/v1/..%2fsleep", route{}, false},
		{"/v1/chat/completions%2f..%2f..%2fcollective_rpc", route{}, false},
		{"/v1/chat%2Fcompletions", route{}, false},
		{"/v1/chat/completions/", route{}, false},
		{"/v1//chat/completions", route{}, false},
		{"/v1/./chat/completions", route{}, false},
		{"/pools/gpu0/v1/chat/completions/../../../sleep", route{}, false},
		{"/pools/%2e%2e/sleep", route{}, false},
		{"/pools//v1/chat/completions", route{}, false},
		{"/pools/gpu0", route{}, false},
		// Control endpoints and everything else.
		{"/sleep?level=1", route{}, false},
		{"/wake_up", route{}, false},
		{"/collective_rpc", route{}, false},
		{"/reset_prefix_cache", route{}, false},
		{"/v1/load_lora_adapter", route{}, false},
		{"/v1/unload_lora_adapter", route{}, false},
		{"/pools/gpu0/sleep", route{}, false},
		{"/v1/models", route{}, false},
		{"/v1/foo", route{}, false},
		{"/V1/chat/completions", route{}, false},
	}
	for _, c := range cases {
		u, err := url.ParseRequestURI(c.uri)
		if err != nil {
			t.Fatalf("%s: %v", c.uri, err)
		}
		got, ok := routeOf(u)
		if ok != c.ok || got != c.want {
			t.Errorf("routeOf(%s) = %+v, %v; want %+v, %v", c.uri, got, ok, c.want, c.ok)
		}
	}
}

// Whatever the request URI, a route is only ever an inference route exactly,
// reached through a path that decodes to it with no dot-segment, empty
// segment or encoded slash on the way.
func FuzzRouteOf(f *testing.F) {
	for _, s := range []string{
		"/v1/chat/completions", "/pools/p0/v1/completions", "/tokenize", "/v1/%2e%2e/sleep?level=1",
		"/v1/..%2fcollective_rpc", "/pools/p0/v1/..%2fsleep", "/v1/chat/completions%2f..%2f..%2fcollective_rpc",
		"/pools/%2e/v1/chat/completions", "/v1/%2E%2E%2Fsleep", "/%76%31/completions",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		u, err := url.ParseRequestURI(uri)
		if err != nil {
			return
		}
		rt, ok := routeOf(u)
		if !ok {
			return
		}
		if !inferenceRoutes[rt.path] || path.Clean(rt.path) != rt.path {
			t.Fatalf("%q: route %q is not an inference route", uri, rt.path)
		}
		if strings.Contains(strings.ToLower(u.EscapedPath()), "%2f") {
			t.Fatalf("%q: routed through an encoded slash", uri)
		}
		want := rt.path
		if rt.pool != "" {
			want = "/pools/" + rt.pool + rt.path
		}
		if u.Path != want {
			t.Fatalf("%q: path %q is not route %+v", uri, u.Path, rt)
		}
		for seg := range strings.SplitSeq(strings.TrimPrefix(u.Path, "/"), "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("%q: routed through segment %q", uri, seg)
			}
		}
	})
}
