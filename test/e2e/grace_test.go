package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A closed-loop client with 2 s of think time keeps its model for the
// residency against a competing queue: poold learns its gaps, instead of
// assuming they are under a second. Then the competitor gets the pool.
func TestThinkingClientKeepsItsModel(t *testing.T) {
	tag := t.Name()
	const residency = 15 * time.Second
	d := startPoold(t, tag, profilesJSON(tag,
		[]pool{{Name: "p0", GPUs: []int{0}, Default: "a", Extra: map[string]any{"minResidency": residency.String()}}},
		[]sim{{ID: "a"}, {ID: "b"}}, nil))
	ready := d.waitPool("p0", 20*time.Second, "a ready", func(p poolView) bool { return p.State == "ready" && p.Profile == "a" })
	loadedAt := time.Now()
	ask := func(model string) {
		t.Helper()
		code, _, body, err := d.post(context.Background(), "/v1/chat/completions", chatBody(model, false, 1))
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %v %s", model, code, err, body)
		}
	}
	const think = 2 * time.Second
	// Two requests teach poold the client's gap.
	ask("a")
	time.Sleep(think) // the client's think time: the workload, not a wait for poold
	ask("a")
	time.Sleep(think)

	competitor := make(chan time.Time, 1)
	go func() {
		ask("b")
		competitor <- time.Now()
	}()
	d.waitPool("p0", 10*time.Second, "b waiting", func(p poolView) bool { return p.Waiting["b"] == 1 })
	for time.Since(loadedAt) < residency-2*think {
		ask("a")
		if p := d.pool("p0"); p.Profile != "a" || p.Engine == nil || p.Engine.PID != ready.Engine.PID {
			t.Fatalf("%s after a loaded, while its client thinks: %+v", time.Since(loadedAt).Round(time.Millisecond), p)
		}
		time.Sleep(think)
	}
	// After the residency, the competitor is served.
	select {
	case at := <-competitor:
		if held := at.Sub(loadedAt); held < residency-2*think {
			t.Fatalf("b was served %s after a loaded, before a's residency (%s)", held, residency)
		}
		t.Logf("a kept the pool %s against a waiting b (residency %s)", at.Sub(loadedAt).Round(time.Millisecond), residency)
	case <-time.After(2 * time.Minute):
		t.Fatal("b was never served")
	}
}
