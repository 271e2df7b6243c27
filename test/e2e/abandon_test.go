package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client cannot lower its bill by leaving, and its leaving stops the
// engine's work: a plain answer whose client left after its headers is
// read to its end and billed the engine's usage; one left before its
// headers is cancelled at the engine at once and billed poold's estimate
// (the prompt from the body's size, the completion from the time the
// engine worked at the profile's time per token), flagged; a stream left
// after its first chunk is billed its prompt's estimate and the chunks
// sent, flagged.
func TestAbandonedRequestsAreBilled(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "m"}, {Name: "p1", GPUs: []int{1}, Default: "tail"}},
		[]sim{{ID: "m", Pools: []string{"p0"}, Flags: []string{"--sim-itl", "20ms"}}, withPools(helperSim(tag, "tail", "slow-tail"), "p1")}, nil))
	d.waitPool("p0", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	d.waitPool("p1", 20*time.Second, "ready", func(p poolView) bool { return p.State == "ready" })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// leave sends body and leaves once the headers come, or once cut
	// says so, whichever is first; it returns poold's request id, if the
	// headers came.
	leave := func(body string, cut func() bool) string {
		rctx, rcancel := context.WithCancel(ctx)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, d.url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", fmt.Sprintf("leaver-%d", time.Now().UnixNano()))
		done := make(chan struct{})
		go func() {
			defer close(done)
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if cut() {
					rcancel()
					return
				}
				if rctx.Err() != nil {
					return
				}
			}
		}()
		resp, err := http.DefaultClient.Do(req)
		id := req.Header.Get("X-Request-Id")
		if err == nil {
			if resp.Header.Get("Content-Type") == "text/event-stream" {
				// A stream: its first chunk, then away.
				line, _ := bufio.NewReader(resp.Body).ReadString('\n')
				if !strings.HasPrefix(line, "data:") {
					t.Errorf("the stream began with %q", line)
				}
			}
			resp.Body.Close() // unread: the connection closes
		}
		rcancel()
		<-done
		return id
	}
	never := func() bool { return false }

	// After the headers: the usage comes a second later, and is billed.
	id := leave(`{"model":"tail","prompt":"hi","max_tokens":900}`, never)
	line := waitLogLine(t, d, id)
	if got := fmt.Sprint(line["status"], line["prompt_tokens"], line["completion_tokens"], line["tokens_estimated"]); got != "200 7 900 false" {
		t.Errorf("a plain answer left after its headers: logged status, tokens, estimated %s; want 200 7 900 false (the engine's usage): %v", got, line)
	}

	// Before the headers: a known time per token first (a whole answer),
	// then a 300-token answer left when the engine has made about 40.
	generated := func() float64 { return metricSum(t, d.url+"/pools/p0", "vllm:generation_tokens_total") }
	if code, _, body := d.send(ctx, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":10}`, nil); code != http.StatusOK {
		t.Fatalf("a whole answer: %d %s", code, body)
	}
	base := generated()
	body := `{"model":"m","prompt":"` + strings.Repeat("word ", 200) + `","max_tokens":300}`
	id = leave(body, func() bool { return generated() >= base+40 })
	// The engine stops: its count stays put, far short of 300.
	var made float64
	for last, deadline := -1.0, time.Now().Add(10*time.Second); ; {
		made = generated() - base
		if made == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine still generates for a client that left: %v tokens", made)
		}
		last = made
		time.Sleep(300 * time.Millisecond)
	}
	if made >= 150 {
		t.Fatalf("the engine made %v of 300 tokens for a client that left at 40", made)
	}
	line = waitLogLine(t, d, id)
	completion, _ := line["completion_tokens"].(float64)
	prompt, _ := line["prompt_tokens"].(float64)
	if line["outcome"] != "client_aborted" || line["tokens_estimated"] != true || prompt < float64(len(body))/4 || completion < made/2 || completion > made*2 {
		t.Errorf("a plain answer left before its headers, after the engine made %v tokens: logged %v", made, line)
	}

	// A stream left after its first chunk: its prompt is billed too.
	id = leave(`{"model":"m","stream":true,"prompt":"`+strings.Repeat("word ", 200)+`","max_tokens":300}`, never)
	line = waitLogLine(t, d, id)
	if prompt, _ := line["prompt_tokens"].(float64); line["outcome"] != "client_aborted" || line["tokens_estimated"] != true || prompt < 250 {
		t.Errorf("a stream left after its first chunk: logged %v", line)
	}
}

// withPools is s limited to pools.
func withPools(s sim, pools ...string) sim {
	s.Pools = pools
	return s
}
