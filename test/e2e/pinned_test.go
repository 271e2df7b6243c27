package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// twoPools is a profiles file with pools gpu0 (chat loaded at start) and
// gpu1 (embed loaded at start), no residency, and a third profile, big,
// that only gpu1 may run.
func twoPools(tag string) []byte {
	return profilesJSON(tag, []pool{
		{Name: "gpu0", GPUs: []int{0}, Default: "chat"},
		{Name: "gpu1", GPUs: []int{1}, Default: "embed"},
	}, []sim{{ID: "chat"}, {ID: "embed"}, {ID: "big", Pools: []string{"gpu1"}}},
		map[string]any{"minResidency": "0s"})
}

// adminTokenFile writes token to a file for --admin-token-file.
func adminTokenFile(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A tenant's request pinned to a pool cannot evict another tenant's model
// there: its model, loaded on another pool, is served there, and the
// pinned request gets a 403 pool_not_allowed naming the rule and the pool
// while the other model stays. Pinned where poold would place it unpinned
// it may swap, as unpinned; a tenant whose pools allow the pool may swap
// it; the admin API loads as before.
func TestTenantPinnedPoolCannotEvict(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, twoPools(tag),
		"--admin-token-file", adminTokenFile(t, "s3cret"),
		"--tenants", writeTenants(t, tenantsJSON(
			tenantSpec{Name: "team-a", Key: "sk-a", Models: []string{"chat", "big"}},
			tenantSpec{Name: "team-b", Key: "sk-b", Models: []string{"embed"}},
			tenantSpec{Name: "team-ops", Key: "sk-ops", Pools: []string{"gpu1"}},
		)))
	d.waitPool("gpu0", 20*time.Second, "chat ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "chat" })
	d.waitPool("gpu1", 20*time.Second, "embed ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "embed" })
	ctx := t.Context()
	post := func(path, key, model string, stream bool) (int, []byte) {
		t.Helper()
		code, _, body := sendTo(ctx, t, d.url+path, chatBody(model, stream, 2), bearer(key))
		return code, body
	}

	for _, stream := range []bool{false, true} {
		code, body := post("/pools/gpu1/v1/chat/completions", "sk-a", "chat", stream)
		c, typ, msg := errorCode(t, body)
		if code != http.StatusForbidden || c != "pool_not_allowed" || typ != "permission_error" ||
			!strings.Contains(msg, `pool "gpu1"`) || !strings.Contains(msg, `tenant "team-a"`) || !strings.Contains(msg, "pools") {
			t.Fatalf("team-a pinned to gpu1 for chat, loaded on gpu0 (stream %v): %d %s", stream, code, body)
		}
	}
	if p := d.pool("gpu1"); p.State != "ready" || p.Profile != "embed" || d.swaps("gpu1") != 0 {
		t.Fatalf("gpu1 after the refused pins: %+v, %d swaps; want embed kept", p, d.swaps("gpu1"))
	}
	if code, _, body := sendTo(ctx, t, d.url+"/v1/embeddings", `{"model":"embed","input":"hi"}`, bearer("sk-b")); code != http.StatusOK {
		t.Fatalf("team-b's embeddings after team-a's refused pins: %d %s", code, body)
	}
	// Pinned where its model is: served there.
	if code, body := post("/pools/gpu0/v1/chat/completions", "sk-a", "chat", false); code != http.StatusOK {
		t.Fatalf("team-a pinned to gpu0, where chat is: %d %s", code, body)
	}

	// big runs on gpu1 only: unpinned it would swap gpu1, so pinned too.
	if code, body := post("/pools/gpu1/v1/chat/completions", "sk-a", "big", false); code != http.StatusOK {
		t.Fatalf("team-a pinned to gpu1 for big, where placement puts it: %d %s", code, body)
	}
	if p := d.pool("gpu1"); p.Profile != "big" {
		t.Fatalf("gpu1 after big: %+v", p)
	}

	// A tenant allowed the pool swaps it.
	if code, body := post("/pools/gpu1/v1/chat/completions", "sk-ops", "chat", false); code != http.StatusOK {
		t.Fatalf("team-ops, allowed gpu1, pinned there for chat: %d %s", code, body)
	}
	if p := d.pool("gpu1"); p.Profile != "chat" {
		t.Fatalf("gpu1 after team-ops' pin: %+v", p)
	}
	// The admin API loads whatever the tenants.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/admin/pools/gpu1/load", strings.NewReader(`{"profile": "embed"}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || d.pool("gpu1").Profile != "embed" {
		t.Fatalf("admin load of embed on gpu1: %d %s", resp.StatusCode, b)
	}
	// team-ops' pools are gpu1 only: gpu0 it may not swap for embed, awake
	// on gpu1.
	if code, body := post("/pools/gpu0/v1/chat/completions", "sk-ops", "embed", false); code != http.StatusForbidden {
		t.Fatalf("team-ops pinned to gpu0 for embed, loaded on gpu1: %d %s", code, body)
	}
	if p := d.pool("gpu0"); p.Profile != "chat" {
		t.Fatalf("gpu0 after team-ops' refused pin: %+v", p)
	}
}

// Without tenants (here with API keys), a pinned request swaps its pool as
// before: the operator's pin; and the admin token reads GET /usage though
// API keys are required.
func TestOperatorPinAndUsageWithAPIKeys(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, twoPools(tag), "--api-keys", "sk-key", "--admin-token-file", adminTokenFile(t, "s3cret"))
	d.waitPool("gpu1", 20*time.Second, "embed ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "embed" })
	d.waitPool("gpu0", 20*time.Second, "chat ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "chat" })
	ctx := t.Context()
	if code, _, body := sendTo(ctx, t, d.url+"/pools/gpu1/v1/chat/completions", chatBody("chat", false, 2), bearer("sk-key")); code != http.StatusOK {
		t.Fatalf("pinned to gpu1 for chat, loaded on gpu0: %d %s", code, body)
	}
	if p := d.pool("gpu1"); p.Profile != "chat" {
		t.Fatalf("gpu1 after the operator's pin: %+v", p)
	}
	// The swap is counted once it is over, which may be just after its
	// request was answered.
	for deadline := time.Now().Add(5 * time.Second); d.swaps("gpu1") != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gpu1: %d swaps counted, want 1", d.swaps("gpu1"))
		}
	}
	for _, c := range []struct {
		auth string
		code int
	}{{"Bearer s3cret", 200}, {"Bearer sk-key", 401}, {"", 401}} {
		if code, body := getUsage(ctx, t, d, "?since=1h", c.auth); code != c.code {
			t.Fatalf("GET /usage with %q: %d %s, want %d", c.auth, code, body, c.code)
		}
	}
}

// getUsage sends GET /usage with the query and Authorization auth ("" for
// none).
func getUsage(ctx context.Context, t *testing.T, d *daemon, query, auth string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url+"/usage"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /usage: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /usage: %v", err)
	}
	return resp.StatusCode, b
}

// With tenants on, GET /usage is reached with the admin token (every
// tenant's lines), and by each tenant's key for its own usage only:
// another tenant's is refused with 403.
func TestUsageWithTenants(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, oneModel(tag, nil, "m"), "--admin-token-file", adminTokenFile(t, "s3cret"),
		"--tenants", writeTenants(t, tenantsJSON(
			tenantSpec{Name: "team-a", Key: "sk-a"},
			tenantSpec{Name: "team-b", Key: "sk-b"},
		)))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx := t.Context()
	for _, key := range []string{"sk-a", "sk-b", "sk-b"} {
		if code, _, body := sendTo(ctx, t, d.url+"/v1/chat/completions", chatBody("m", false, 3), bearer(key)); code != http.StatusOK {
			t.Fatalf("%s: %d %s", key, code, body)
		}
	}
	type report struct {
		Tenant string
		Rows   []struct {
			Key      string
			Use      string
			Requests int
		}
	}
	read := func(query, auth string) (int, report, []byte) {
		t.Helper()
		code, body := getUsage(ctx, t, d, query, auth)
		var r report
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatalf("GET /usage%s: %v: %s", query, err, body)
			}
		}
		return code, r, body
	}
	requests := func(r report, tenant string) int {
		n := 0
		for _, row := range r.Rows {
			if row.Key == tenant {
				n += row.Requests
			}
		}
		return n
	}
	// The ledger writes in batches: poll until both tenants' rows are in.
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, r, body := read("?since=1h", "Bearer s3cret")
		if code != http.StatusOK {
			t.Fatalf("GET /usage with the admin token: %d %s", code, body)
		}
		if requests(r, "team-a") == 1 && requests(r, "team-b") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin's report never showed team-a's 1 and team-b's 2 requests: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	for _, query := range []string{"?since=1h", "?since=1h&tenant=team-a"} {
		code, r, body := read(query, "Bearer sk-a")
		if code != http.StatusOK || r.Tenant != "team-a" || requests(r, "team-a") != 1 {
			t.Fatalf("team-a's own usage (%s): %d %s", query, code, body)
		}
		for _, row := range r.Rows {
			if row.Key != "team-a" {
				t.Fatalf("team-a's report (%s) shows a line not its own: %+v in %s", query, row, body)
			}
		}
	}
	code, body := getUsage(ctx, t, d, "?since=1h&tenant=team-b", "Bearer sk-a")
	if c, typ, msg := errorCode(t, body); code != http.StatusForbidden || c != "usage_not_allowed" || typ != "permission_error" || !strings.Contains(msg, "team-b") {
		t.Fatalf("team-a asking for team-b's usage: %d %s", code, body)
	}
	if code, _, body := read("?since=1h", "Bearer sk-b"); code != http.StatusOK || !strings.Contains(string(body), `"key": "team-b"`) || strings.Contains(string(body), "team-a") {
		t.Fatalf("team-b's own usage: %d %s", code, body)
	}
	for _, auth := range []string{"", "Bearer sk-nobody"} {
		if code, body := getUsage(ctx, t, d, "?since=1h", auth); code != http.StatusUnauthorized {
			t.Fatalf("GET /usage with %q: %d %s", auth, code, body)
		}
	}
}
