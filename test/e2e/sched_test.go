package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// End-to-end tests of the swap scheduler: real poold, simulator engines that
// take about a second to load.

// metricSum adds up every sample of GET /metrics whose series starts with
// prefix (a name and an opening brace) and contains all of labels.
func (d *daemon) metricSum(prefix string, labels ...string) float64 {
	d.t.Helper()
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
lines:
	for sc.Scan() {
		series, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(series, prefix) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(series, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			d.t.Fatalf("metric %s: %v", series, err)
		}
		sum += v
	}
	return sum
}

// swaps counts the pool's successful swaps from one profile to another (not
// its preload).
func (d *daemon) swaps(pool string) int {
	all := d.metricSum("poold_swaps_total{", `pool="`+pool+`"`, `result="ok"`)
	preload := d.metricSum("poold_swaps_total{", `pool="`+pool+`"`, `result="ok"`, `from=""`)
	return int(all - preload)
}

// swapTime is the time the pool has spent in swaps so far, without draining:
// stopping, releasing VRAM, starting and loading.
func (d *daemon) swapTime(pool string) time.Duration {
	var s float64
	for _, phase := range []string{"stop", "vram_release", "start", "ready"} {
		s += d.metricSum("poold_swap_duration_seconds_sum{", `pool="`+pool+`"`, `phase="`+phase+`"`)
	}
	return time.Duration(s * float64(time.Second))
}

// result is one finished request as a client saw it.
type result struct {
	code     int
	body     []byte
	err      error
	sent     time.Time
	took     time.Duration
	retryHdr string
	refused  string // X-Poold-Refused
}

func (d *daemon) timedPost(ctx context.Context, body string) result {
	r := result{sent: time.Now()}
	var hdr http.Header
	r.code, hdr, r.body, r.err = d.post(ctx, "/v1/chat/completions", body)
	r.took = time.Since(r.sent)
	if hdr != nil {
		r.retryHdr, r.refused = hdr.Get("Retry-After"), hdr.Get("X-Poold-Refused")
	}
	return r
}

// closedLoop sends body again and again, each request as soon as the last one
// is answered, until stop is closed or the deadline passes, and returns what
// every request got.
func (d *daemon) closedLoop(stop <-chan struct{}, deadline time.Time, body string) []result {
	var out []result
	for time.Now().Before(deadline) {
		select {
		case <-stop:
			return out
		default:
		}
		out = append(out, d.timedPost(context.Background(), body))
	}
	return out
}

// Starvation: one client keeps an "a" stream always in flight (two looping
// streams, each started as soon as the other ends), yet a single "b" request
// is served within minResidency + the swap + one "a" request, because after
// the residency the gate closes and the pool drains for b.
func TestStarvation(t *testing.T) {
	const residency = 2 * time.Second
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": residency.String()}}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-itl", "25ms"}},
			{ID: "b", Flags: []string{"--sim-load-delay", "1s"}},
		}, nil))
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	stop := make(chan struct{})
	deadline := time.Now().Add(60 * time.Second) // far beyond the bound: a starved b fails below
	var wg sync.WaitGroup
	aResults := make([][]result, 2)
	for i := range aResults {
		wg.Go(func() { aResults[i] = d.closedLoop(stop, deadline, chatBody("a", true, 20)) })
	}
	d.waitPool("p0", 10*time.Second, "a streams in flight", func(p poolView) bool { return p.InFlight >= 1 })
	swap0 := d.swapTime("p0")

	b := d.timedPost(context.Background(), chatBody("b", false, 3))
	close(stop)
	wg.Wait()

	if b.err != nil || b.code != http.StatusOK {
		t.Fatalf("b: %d %v %s", b.code, b.err, b.body)
	}
	var longestA time.Duration
	n := 0
	for _, rs := range aResults {
		for _, r := range rs {
			if r.err != nil || r.code != http.StatusOK {
				t.Fatalf("an a stream failed: %d %v %s", r.code, r.err, r.body)
			}
			checkStream(t, r.body, "a", 20)
			// Only the a requests served before b count as "one a request"
			// (those queued behind the gate waited for b's swap as well).
			if r.sent.Before(b.sent) {
				longestA = max(longestA, r.took)
			}
			n++
		}
	}
	swap := d.swapTime("p0") - swap0
	// The slack covers HTTP and process scheduling on a busy machine; a starved
	// b waits for the whole minute instead.
	const slack = time.Second
	bound := residency + swap + longestA + slack
	t.Logf("b served after %s (bound %s = residency %s + swap %s + one a %s + %s); %d a streams", b.took, bound, residency, swap, longestA, slack, n)
	if b.took > bound {
		t.Fatalf("b waited %s, more than %s", b.took, bound)
	}
	if got := d.swaps("p0"); got < 1 {
		t.Fatalf("%d swaps: b was never loaded", got)
	}
}

// Thrash: two closed-loop clients, one always asking for a and one always for
// b. The pool swaps at most T/minResidency + 1 times, every request succeeds
// and both clients are served. (A residency of 0 swaps for nearly every
// request: see test/schedbench for the comparison.)
func TestThrash(t *testing.T) {
	const (
		residency = 3 * time.Second
		span      = 12 * time.Second
	)
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": residency.String()}}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-load-delay", "1s", "--sim-itl", "10ms"}},
			{ID: "b", Flags: []string{"--sim-load-delay", "1s", "--sim-itl", "10ms"}},
		}, nil))
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	deadline := time.Now().Add(span)
	var wg sync.WaitGroup
	var ra, rb []result
	wg.Go(func() { ra = d.closedLoop(nil, deadline, chatBody("a", false, 5)) })
	wg.Go(func() { rb = d.closedLoop(nil, deadline, chatBody("b", false, 5)) })
	wg.Wait()

	for _, r := range append(ra, rb...) {
		if r.err != nil || r.code != http.StatusOK {
			t.Fatalf("a request failed: %d %v %s", r.code, r.err, r.body)
		}
	}
	swaps := d.swaps("p0")
	limit := int(span/residency) + 1
	t.Logf("%d swaps (limit %d); a served %d, b served %d", swaps, limit, len(ra), len(rb))
	if swaps > limit {
		t.Fatalf("%d swaps in %s with minResidency %s, more than %d", swaps, span, residency, limit)
	}
	if len(ra) < 2 || len(rb) < 2 {
		t.Fatalf("a client was starved: a served %d, b served %d", len(ra), len(rb))
	}
}

// A full queue refuses at once with 503 and Retry-After, streams included
// (nothing was committed yet); a waiter that disconnects frees its place.
func TestQueueOverflow(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Extra: map[string]any{"maxQueue": 1}}},
		[]sim{{ID: "slow", Flags: []string{"--sim-load-delay", "30s"}}}, nil),
		"--keepalive-interval", "100ms")
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan result, 1)
	go func() { first <- d.timedPost(ctx, chatBody("slow", false, 1)) }()
	d.waitPool("p0", 5*time.Second, "one waiting", func(p poolView) bool { return p.Waiting["slow"] == 1 })

	for _, stream := range []bool{false, true} {
		r := d.timedPost(context.Background(), chatBody("slow", stream, 1))
		var e apiErr
		if r.code != http.StatusServiceUnavailable || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "queue_full" {
			t.Fatalf("stream=%v: got %d %s; want 503 queue_full", stream, r.code, r.body)
		}
		if secs, err := strconv.Atoi(r.retryHdr); err != nil || secs < 1 {
			t.Fatalf("stream=%v: Retry-After %q", stream, r.retryHdr)
		}
		if r.refused != "queue_full" { // nothing started: another host may take it
			t.Fatalf("stream=%v: X-Poold-Refused %q, want queue_full", stream, r.refused)
		}
	}
	cancel()
	<-first
	d.waitPool("p0", 2*time.Second, "queue empty", func(p poolView) bool { return len(p.Waiting) == 0 })
	// The freed place is taken by the next request.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() { d.timedPost(ctx2, chatBody("slow", false, 1)) }()
	d.waitPool("p0", 5*time.Second, "the place taken again", func(p poolView) bool { return p.Waiting["slow"] == 1 })
}

// maxQueueWait ends a wait with 503 and Retry-After; the profile's own
// maxQueueWait (1s) overrides the pool's (1m). A stream that already got
// keep-alive comments gets the same error as its last SSE event instead.
func TestQueueWaitTimeout(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Extra: map[string]any{"maxQueueWait": "1m"}}},
		[]sim{{ID: "slow", Flags: []string{"--sim-load-delay", "30s"}, Extra: map[string]any{"maxQueueWait": "1s"}}}, nil),
		"--keepalive-interval", "200ms")

	r := d.timedPost(context.Background(), chatBody("slow", false, 1))
	var e apiErr
	if r.code != http.StatusServiceUnavailable || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "queue_timeout" {
		t.Fatalf("got %d %s; want 503 queue_timeout", r.code, r.body)
	}
	if secs, err := strconv.Atoi(r.retryHdr); err != nil || secs < 1 {
		t.Fatalf("Retry-After %q", r.retryHdr)
	}
	if r.took < time.Second || r.took > 30*time.Second {
		t.Fatalf("timed out after %s; want the profile's 1s, not the pool's minute", r.took)
	}
	if r.refused != "" { // the wait began a load: no other host should start one too
		t.Fatalf("a queue timeout says X-Poold-Refused %q", r.refused)
	}

	r = d.timedPost(context.Background(), chatBody("slow", true, 1))
	if r.err != nil || r.code != http.StatusOK {
		t.Fatalf("stream: %d %v %s", r.code, r.err, r.body)
	}
	body := string(r.body)
	if !strings.HasPrefix(body, ": loading slow, 0s\n\n") {
		t.Fatalf("stream does not start with a keep-alive comment:\n%s", body)
	}
	events := sseEvents(r.body)
	if len(events) != 1 || json.Unmarshal([]byte(events[0]), &e) != nil || e.Error.Code != "queue_timeout" ||
		!strings.Contains(e.Error.Message, "retry after") {
		t.Fatalf("stream's events %q; want one queue_timeout error event", events)
	}
}

// Waiters that disconnect leave the queue at once, as /status shows, the
// stream committed by keep-alive comments included.
func TestDisconnectedWaitersLeaveQueue(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}}},
		[]sim{{ID: "slow", Flags: []string{"--sim-load-delay", "30s"}}}, nil),
		"--keepalive-interval", "100ms")

	// A stream that has received a keep-alive comment.
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	req, _ := http.NewRequestWithContext(sctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(chatBody("slow", true, 1)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, ": loading slow") || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("first line %q (%v), Content-Type %q", line, err, resp.Header.Get("Content-Type"))
	}
	var cancels []context.CancelFunc
	done := make(chan struct{}, 2)
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		go func() {
			d.timedPost(ctx, chatBody("slow", false, 1))
			done <- struct{}{}
		}()
	}
	d.waitPool("p0", 5*time.Second, "three waiting", func(p poolView) bool { return p.Waiting["slow"] == 3 })

	scancel()
	resp.Body.Close()
	d.waitPool("p0", 2*time.Second, "two waiting", func(p poolView) bool { return p.Waiting["slow"] == 2 })
	for i, want := range []int{1, 0} {
		cancels[i]()
		<-done
		d.waitPool("p0", 2*time.Second, fmt.Sprintf("%d waiting", want), func(p poolView) bool { return p.Waiting["slow"] == want })
	}
}

// The openai-go client is unaffected by keep-alive comments: a stream whose
// model loads for longer than the interval reads as usual, and a load that
// fails after the comments surfaces as the stream's error.
func TestKeepAliveOpenAIClient(t *testing.T) {
	tag := t.Name()
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-load-delay", "1s"}},
			{ID: "b", Flags: []string{"--sim-load-delay", "1s"}},
			{ID: "broken", Flags: []string{"--sim-load-delay", "1s", "--sim-fail-load"}},
		}, nil),
		"--keepalive-interval", "200ms")
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	client := openai.NewClient(option.WithBaseURL(d.url+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two")}

	// Through a swap to b (a second of loading: several comments).
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "b", Messages: msgs, MaxTokens: openai.Int(4)})
	var content string
	for stream.Next() {
		content += stream.Current().Choices[0].Delta.Content
	}
	if err := stream.Err(); err != nil || content != "tok0 tok1 tok2 tok3 " {
		t.Fatalf("stream through a swap: %q, %v", content, err)
	}
	// The same kind of swap, read raw: the comments were really there.
	r := d.timedPost(ctx, chatBody("a", true, 4))
	if r.code != http.StatusOK || !strings.HasPrefix(string(r.body), ": loading a, 0s\n\n") {
		t.Fatalf("raw stream through a swap: %d\n%s", r.code, r.body)
	}
	checkStream(t, r.body, "a", 4)

	// A load that fails after the comments: the client gets the error.
	stream = client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "broken", Messages: msgs})
	for stream.Next() {
		t.Fatalf("chunk from a failed load: %s", stream.Current().RawJSON())
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "simulated load failure") {
		t.Fatalf("stream error %v; want the load failure", err)
	}
}

// Explicit unload and load go through the scheduler: an unload waits for the
// in-flight stream (the pool drains like a swap), and both answer with the
// pool's status once done. They need the admin token.
func TestAdminLoadUnload(t *testing.T) {
	tag := t.Name()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": "0s"}}},
		[]sim{
			{ID: "a", Flags: []string{"--sim-itl", "40ms"}},
			{ID: "b", Aliases: []string{"bee"}, Flags: []string{"--sim-load-delay", "500ms"}},
		}, nil),
		"--admin-token-file", tokenFile)
	d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })

	admin := func(path, token, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, d.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := admin("/admin/pools/p0/unload", "wrong", ""); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d %s", code, body)
	}

	aDone := make(chan result, 1)
	go func() { aDone <- d.timedPost(context.Background(), chatBody("a", true, 25)) }()
	d.waitPool("p0", 10*time.Second, "a in flight", func(p poolView) bool { return p.InFlight == 1 })
	unloaded := make(chan time.Time, 1)
	go func() {
		if code, body := admin("/admin/pools/p0/unload", "s3cret", ""); code != http.StatusOK || !strings.Contains(string(body), `"state": "empty"`) {
			t.Errorf("unload: %d %s", code, body)
		}
		unloaded <- time.Now()
	}()
	d.waitPool("p0", 10*time.Second, "draining for the unload", func(p poolView) bool {
		return p.State == "draining" && p.Gate == "closed" && p.InFlight == 1
	})
	a := <-aDone
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("a stream: %d %v", a.code, a.err)
	}
	checkStream(t, a.body, "a", 25)
	if at := <-unloaded; at.Before(a.sent.Add(a.took)) {
		t.Fatal("the unload finished before the in-flight stream")
	}
	if p := d.pool("p0"); p.State != "empty" || p.Profile != "" || p.Engine != nil {
		t.Fatalf("after the unload: %+v", p)
	}

	code, body := admin("/admin/pools/p0/load", "s3cret", `{"profile": "bee"}`)
	if code != http.StatusOK || !strings.Contains(string(body), `"profile": "b"`) {
		t.Fatalf("load: %d %s", code, body)
	}
	if p := d.pool("p0"); p.State != "ready" || p.Profile != "b" {
		t.Fatalf("after the load: %+v", p)
	}
}
