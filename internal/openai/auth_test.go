package openai

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAPIKeysRequire(t *testing.T) {
	sum := sha256.Sum256([]byte("hashed-key"))
	keys, err := NewAPIKeys([]string{"plain-key", " ", "sha256:" + hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	h := keys.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	cases := []struct {
		path, header, value string
		want                int
	}{
		{"/v1/chat/completions", "Authorization", "Bearer plain-key", http.StatusTeapot},
		{"/v1/chat/completions", "Authorization", "bearer hashed-key", http.StatusTeapot},
		{"/pools/p0/v1/completions", "X-Api-Key", "plain-key", http.StatusTeapot},
		{"/v1/models", "", "", http.StatusUnauthorized},
		{"/v1/chat/completions", "Authorization", "Bearer wrong", http.StatusUnauthorized},
		{"/v1/chat/completions", "Authorization", "Basic plain-key", http.StatusUnauthorized},
		{"/pools/p0/v1/completions", "X-Api-Key", "", http.StatusUnauthorized},
		{"/health", "", "", http.StatusTeapot},
		{"/ready", "", "", http.StatusTeapot},
		{"/status", "", "", http.StatusTeapot},
		{"/metrics", "", "", http.StatusTeapot},
		{"/pools/p0/metrics", "", "", http.StatusTeapot},
		{"/admin/pools/p0/load", "", "", http.StatusTeapot},
		{"/usage", "Authorization", "Bearer the-admin-token", http.StatusTeapot}, // its own auth decides
		{"/usage/x", "", "", http.StatusUnauthorized},
		// vLLM's un-prefixed inference routes, and any other path, need a key.
		{"/score", "", "", http.StatusUnauthorized},
		{"/pools/p0/tokenize", "", "", http.StatusUnauthorized},
		{"/v2/rerank", "", "", http.StatusUnauthorized},
		{"/pools/p0/v1/x/metrics", "", "", http.StatusUnauthorized},
		{"/pools//metrics", "", "", http.StatusUnauthorized},
		{"/anything", "", "", http.StatusUnauthorized},
		{"/tokenize", "X-Api-Key", "plain-key", http.StatusTeapot},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", c.path, nil)
		if c.header != "" {
			r.Header.Set(c.header, c.value)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s with %s %q: %d, want %d", c.path, c.header, c.value, w.Code, c.want)
			continue
		}
		if c.want != http.StatusUnauthorized {
			continue
		}
		var e struct {
			Error apiError `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Type != "authentication_error" || e.Error.Code != "invalid_api_key" {
			t.Errorf("401 body: %s", w.Body)
		}
		if c.value != "" && strings.Contains(w.Body.String(), c.value) {
			t.Errorf("401 body echoes the key: %s", w.Body)
		}
	}
}

func TestAPIKeysNone(t *testing.T) {
	keys, err := NewAPIKeys([]string{"", "  "})
	if err != nil || keys != nil {
		t.Fatalf("blank keys: %v %v, want no enforcement", keys, err)
	}
	if _, err := NewAPIKeys([]string{"ok", "sha256:zz"}); err == nil || !strings.Contains(err.Error(), "api key 1") || strings.Contains(err.Error(), "zz") {
		t.Fatalf("bad hash: %v", err)
	}
}
