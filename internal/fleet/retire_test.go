package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// A hosts file that replaces every host serving a model (one name keeps,
// at a new URL; one is new) keeps the old hosts routing until the new ones
// have been polled: requests sent all through the change, while the new
// hosts' polls are held back, never get 404 model_not_found; once the new
// hosts answer, they serve and the old ones leave.
func TestHostsChangeKeepsServing(t *testing.T) {
	pool := []statusapi.Pool{readyPool("gpu0", "qwen", 0)}
	a1, a2 := newFakeHost(t, "a1", pool, model("chat", "qwen")), newFakeHost(t, "a2", pool, model("chat", "qwen"))
	b1, b2 := newFakeHost(t, "b1", pool, model("chat", "qwen")), newFakeHost(t, "b2", pool, model("chat", "qwen"))
	// A poll timeout long enough that the held polls outlast the requests
	// below, not the bound on how long the old hosts wait (2×4s).
	tf := startFleet(t, Options{PollTimeout: 4 * time.Second}, HandlerOptions{}, a1, a2)
	hold := make(chan struct{})
	for _, h := range []*fakeHost{b1, b2} {
		h.set(func(fh *fakeHost) { fh.hold = hold })
	}
	send := func(n int) map[string]int {
		t.Helper()
		served := make(map[string]int)
		for range n {
			resp, body := tf.post(chat)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s during the change", resp.StatusCode, body)
			}
			served[resp.Header.Get("X-Fleet-Host")]++
		}
		return served
	}
	send(5)
	renamed := b1.spec()
	renamed.Name = "a1" // a1's name at b1's URL
	tf.fleet.Apply(&File{Hosts: []HostSpec{renamed, b2.spec()}})
	served := send(50)
	if a1.postCount()+a2.postCount() != 55 || b1.postCount()+b2.postCount() > 0 {
		t.Fatalf("while the new hosts were not polled: the old hosts served %d and %d, the new %d and %d",
			a1.postCount(), a2.postCount(), b1.postCount(), b2.postCount())
	}
	t.Logf("while the new hosts' polls were held: %v", served)

	close(hold)
	waitFor(t, "the old hosts gone", func() bool {
		hosts, _ := tf.fleet.Status()
		return len(hosts) == 2 && hosts[0].URL == b1.srv.URL && hosts[0].Healthy && hosts[1].Name == "b2" && hosts[1].Healthy
	})
	before := a1.postCount() + a2.postCount()
	send(20)
	if a1.postCount()+a2.postCount() != before || b1.postCount()+b2.postCount() != 20 {
		t.Fatalf("after the change the old hosts served %d more, the new %d of 20", a1.postCount()+a2.postCount()-before, b1.postCount()+b2.postCount())
	}
}

// Removed hosts wait for the added ones at most retireAfter: a new host
// whose polls never answer does not keep them.
func TestHostsChangeBounded(t *testing.T) {
	pool := []statusapi.Pool{readyPool("gpu0", "qwen", 0)}
	a := newFakeHost(t, "a", pool, model("chat", "qwen"))
	b := newFakeHost(t, "b", pool, model("chat", "qwen"))
	b.set(func(fh *fakeHost) { fh.hold = make(chan struct{}) }) // never released
	tf := startFleet(t, Options{PollTimeout: 200 * time.Millisecond}, HandlerOptions{}, a)
	start := time.Now()
	tf.fleet.Apply(&File{Hosts: []HostSpec{b.spec()}})
	if resp, body := tf.post(chat); resp.StatusCode != 200 || !strings.Contains(body, `"a"`) {
		t.Fatalf("at once after the change: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "a gone", func() bool { hosts, _ := tf.fleet.Status(); return len(hosts) == 1 && hosts[0].Name == "b" })
	if took := time.Since(start); took < tf.fleet.retireAfter() {
		t.Fatalf("a left after %v, before the bound %v", took, tf.fleet.retireAfter())
	}
	if resp, _ := tf.post(chat); resp.StatusCode != 404 {
		t.Fatalf("after the bound, with no host polled: %d, want 404", resp.StatusCode)
	}
}

// A host removed and listed again before it left (the file flipped back)
// serves on, polled by the same poller; one listed again at another URL
// while retiring waits for the new one like any added host.
func TestHostsChangeBack(t *testing.T) {
	pool := []statusapi.Pool{readyPool("gpu0", "qwen", 0)}
	a := newFakeHost(t, "a", pool, model("chat", "qwen"))
	b := newFakeHost(t, "b", pool, model("chat", "qwen"))
	c := newFakeHost(t, "c", pool, model("chat", "qwen"))
	hold := make(chan struct{})
	defer close(hold)
	b.set(func(fh *fakeHost) { fh.hold = hold })
	c.set(func(fh *fakeHost) { fh.hold = hold })
	tf := startFleet(t, Options{PollTimeout: 4 * time.Second}, HandlerOptions{}, a)
	tf.fleet.Apply(&File{Hosts: []HostSpec{b.spec()}})
	tf.fleet.Apply(&File{Hosts: []HostSpec{a.spec(), b.spec()}}) // a back
	if resp, body := tf.post(chat); resp.StatusCode != 200 || !strings.Contains(body, `"a"`) {
		t.Fatalf("a, listed again: %d %s", resp.StatusCode, body)
	}
	elsewhere := c.spec()
	elsewhere.Name = "a" // a's name at c's URL
	tf.fleet.Apply(&File{Hosts: []HostSpec{elsewhere}})
	for range 20 {
		if resp, body := tf.post(chat); resp.StatusCode != 200 || !strings.Contains(body, `"a"`) || c.postCount() > 0 {
			t.Fatalf("a at a new URL not yet polled: %d %s", resp.StatusCode, body)
		}
	}
}
