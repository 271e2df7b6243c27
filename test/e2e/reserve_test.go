package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/poold/poold/internal/rdb/rdbtest"
)

// burst is what a burst of requests of one body against a token limit got.
type burst struct {
	served   int // tokens of the answers served (their usage)
	excess   int // tokens used beyond the least the daemon reserved, summed
	answered int // 200s
	refused  int // 429s on tokens
	took     time.Duration
	problems []string
}

// tokenBurst sends n copies of body at once through send and adds up what
// they got. least is the least the daemon reserves for body: its prompt's
// estimate from the body's size (a token per 4 bytes, rounded up: the daemon
// forwards no shorter a body) plus its max_tokens.
func tokenBurst(n int, body string, maxTokens int, send func(ctx context.Context) (int, []byte, error)) burst {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	least := (len(body)+3)/4 + maxTokens
	var mu sync.Mutex // guards b
	var b burst
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-release
			code, raw, err := send(ctx)
			mu.Lock()
			defer mu.Unlock()
			var a struct {
				Usage struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
				Error struct{ Code, Type, Message string }
			}
			var jerr error
			if err == nil {
				jerr = json.Unmarshal(raw, &a)
			}
			switch {
			case err != nil || jerr != nil:
				b.problems = append(b.problems, fmt.Sprintf("%d %v %v %s", code, err, jerr, raw))
			case code == http.StatusOK && a.Usage.CompletionTokens == maxTokens:
				used := a.Usage.PromptTokens + a.Usage.CompletionTokens
				b.answered++
				b.served += used
				b.excess += max(0, used-least)
			case code == http.StatusTooManyRequests && a.Error.Code == "rate_limit_exceeded" && a.Error.Type == "tokens" &&
				strings.Contains(a.Error.Message, "may use up to"):
				b.refused++
			default:
				b.problems = append(b.problems, fmt.Sprintf("%d %s", code, raw))
			}
		})
	}
	start := time.Now()
	close(release)
	wg.Wait()
	b.took = time.Since(start)
	return b
}

// check fails t unless the tokens served stay within the bound of a limit
// of tpm reserved up front (docs/tenancy.md): the limit, plus what it
// refills while the burst lasts, plus what the answers used beyond what was
// reserved for them (the estimate's error), and unless some were refused.
func (b burst) check(t *testing.T, tpm int) {
	t.Helper()
	bound := float64(tpm) + float64(tpm)*b.took.Seconds()/60 + float64(b.excess)
	t.Logf("%d served (%d tokens, %.2f× the limit of %d), %d refused on tokens, in %v; bound %.0f (%d of it the estimate's error)",
		b.answered, b.served, float64(b.served)/float64(tpm), tpm, b.refused, b.took.Round(time.Millisecond), bound, b.excess)
	if float64(b.served) > bound {
		t.Errorf("%d tokens served, above the bound of %.0f", b.served, bound)
	}
	if len(b.problems) > 0 {
		t.Errorf("%d answers neither served nor refused on tokens, the first: %s", len(b.problems), b.problems[0])
	}
	if b.answered == 0 || b.refused == 0 {
		t.Errorf("%d served and %d refused: want both", b.answered, b.refused)
	}
}

// 200 requests at once against tpm 1,000 on poold: each takes its worst
// case (its prompt's estimate and its max_tokens) before it is forwarded,
// so the tokens served stay within the limit and its error; debited only
// at their end, 87 of them were served, 2× the limit. The refusals are
// recorded as rate_limited.
func TestTenantTokensReservedUpFront(t *testing.T) {
	tag := t.Name()
	const tpm, n, maxTokens = 1000, 200, 20
	d := startPoold(t, tag, oneModel(tag, nil, "m"), "--tenants", writeTenants(t, tenantsJSON(tenantSpec{Name: "team-t", Key: "sk-t", TPM: tpm})))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	body := chatBody("m", false, maxTokens)
	b := tokenBurst(n, body, maxTokens, func(ctx context.Context) (int, []byte, error) {
		code, _, raw, err := postWith(ctx, d.url+"/v1/chat/completions", "sk-t", body)
		return code, raw, err
	})
	b.check(t, tpm)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := metricSum(t, d.url, "poold_requests_total", `client="team-t"`, `code_class="4xx"`, `outcome="rate_limited"`)
		if int(n) == b.refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v requests recorded rate_limited, want the %d refused", n, b.refused)
		}
	}
}

// The same on two fleetd replicas sharing the limit in one Redis, 100
// requests on each: together they serve no more than the limit and its
// error, where debited only at their end all 200 were served, 4.6× the
// limit. Every check reached Redis (fail-open would void the bound).
func TestFleetTenantTokensReservedUpFront(t *testing.T) {
	const tpm, n, maxTokens = 1000, 200, 20
	url := rdbtest.Start(t)
	hosts := hostsWithA(t, 1, nil)
	tenants := writeTenants(t, tenantsJSON(team("team-t", 0, tpm)))
	replicas := []*fleetd{
		startFleetd(t, hosts, "--redis-url", url, "--tenants", tenants, "--redis-timeout", "10s"),
		startFleetd(t, hosts, "--redis-url", url, "--tenants", tenants, "--redis-timeout", "10s"),
	}
	body := fmt.Sprintf(`{"model": "a", "max_tokens": %d, "messages": [{"role": "user", "content": "say something nice"}]}`, maxTokens)
	var mu sync.Mutex // guards next
	next := 0
	b := tokenBurst(n, body, maxTokens, func(ctx context.Context) (int, []byte, error) {
		mu.Lock()
		f := replicas[next%2]
		next++
		mu.Unlock()
		resp, raw, err := f.send(ctx, "/v1/chat/completions", "team-t", body)
		if err != nil {
			return 0, nil, err
		}
		return resp.StatusCode, raw, nil
	})
	b.check(t, tpm)
	for _, f := range replicas {
		if v := metricSum(t, f.url, "fleetd_tenant_limits_unchecked_total"); v != 0 {
			t.Errorf("%v checks did not reach Redis", v)
		}
	}
}

// postWith posts a JSON body to url with key as its bearer token.
func postWith(ctx context.Context, url, key, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw, err
}
