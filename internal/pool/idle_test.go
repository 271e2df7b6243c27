package pool

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// The idle release policy, driven by hand with the fake clock of
// scheduler_test.go.

var idlePolicy = Policy{
	IdleTimeout:  map[string]time.Duration{"a": time.Minute},
	MaxKeepAlive: map[string]time.Duration{"a": 10 * time.Minute},
}

// releaseAt is s's due release as an offset, or "none".
func releaseAt(s *Scheduler) string {
	if at, ok := s.ReleaseAt(); ok {
		return at.Sub(t0).String()
	}
	return "none"
}

// A loaded engine is released its idleTimeout after Ready when no request
// comes, and Next asks for the release only then.
func TestIdleReleaseAfterReady(t *testing.T) {
	s := loadedAt(idlePolicy, "a", t0)
	if got := releaseAt(s); got != "1m0s" {
		t.Fatalf("releaseAt = %s, want 1m0s", got)
	}
	if d := s.Next(at(59 * time.Second)); d.Release || !d.Recheck.Equal(at(time.Minute)) {
		t.Fatalf("before the timeout: %+v, want a recheck at 1m and no release", d)
	}
	if d := s.Next(at(time.Minute)); !d.Release || d.Load != "" || len(d.Admit) != 0 {
		t.Fatalf("at the timeout: %+v, want a release", d)
	}
}

// Every request resets the timer, which starts when the last in-flight
// answer ends: nothing is due while one is in flight, however long.
func TestIdleTimerResetByEveryRequest(t *testing.T) {
	s := loadedAt(idlePolicy, "a", t0)
	w1, w2 := waiter("a", 0, at(50*time.Second)), waiter("a", 0, at(55*time.Second))
	mustArrive(t, s, w1, true)
	mustArrive(t, s, w2, true)
	if got := releaseAt(s); got != "none" {
		t.Fatalf("with requests in flight: releaseAt = %s, want none", got)
	}
	if d := s.Next(at(time.Hour)); d.Release {
		t.Fatalf("an hour on, two in flight: %+v, want no release", d)
	}
	s.Release(at(70*time.Second), KeepAlive{})
	if got := releaseAt(s); got != "none" {
		t.Fatalf("one still in flight: releaseAt = %s, want none", got)
	}
	s.Release(at(90*time.Second), KeepAlive{})
	if got := releaseAt(s); got != "2m30s" {
		t.Fatalf("after the last answer at 1m30s: releaseAt = %s, want 2m30s", got)
	}
	if d := s.Next(at(2 * time.Minute)); d.Release {
		t.Fatalf("at 2m: %+v, want no release yet", d)
	}
	if d := s.Next(at(150 * time.Second)); !d.Release {
		t.Fatalf("at 2m30s: %+v, want the release", d)
	}
}

// A request's keep_alive sets the stay from its end, bounded by
// MaxKeepAlive: shorter, longer up to the bound, negative as long as
// allowed, zero at once; the next request without one goes back to the
// idle timeout.
func TestKeepAliveBoundedByMaxKeepAlive(t *testing.T) {
	for _, tt := range []struct {
		name string
		pol  Policy
		k    KeepAlive
		want string
	}{
		{"none", idlePolicy, KeepAlive{}, "2m0s"},
		{"shorter", idlePolicy, KeepAlive{Set: true, D: 5 * time.Second}, "1m5s"},
		{"longer, within the bound", idlePolicy, KeepAlive{Set: true, D: 5 * time.Minute}, "6m0s"},
		{"beyond the bound", idlePolicy, KeepAlive{Set: true, D: time.Hour}, "11m0s"},
		{"negative: the bound", idlePolicy, KeepAlive{Set: true, D: -1}, "11m0s"},
		{"zero: at once", idlePolicy, KeepAlive{Set: true, D: 0}, "1m0s"},
		{"no idle timeout, no bound: what it asks", Policy{}, KeepAlive{Set: true, D: time.Hour}, "1h1m0s"},
		{"no idle timeout, no bound, negative: never", Policy{}, KeepAlive{Set: true, D: -1}, "none"},
		{"no idle timeout, none asked: never", Policy{}, KeepAlive{}, "none"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := loadedAt(tt.pol, "a", t0)
			mustArrive(t, s, waiter("a", 0, at(30*time.Second)), true)
			s.Release(at(time.Minute), tt.k)
			if got := releaseAt(s); got != tt.want {
				t.Fatalf("releaseAt = %s, want %s", got, tt.want)
			}
		})
	}
	s := loadedAt(idlePolicy, "a", t0)
	mustArrive(t, s, waiter("a", 0, at(time.Second)), true)
	s.Release(at(2*time.Second), KeepAlive{Set: true, D: 0})
	mustArrive(t, s, waiter("a", 0, at(2*time.Second)), true)
	s.Release(at(3*time.Second), KeepAlive{})
	if got := releaseAt(s); got != "1m3s" {
		t.Fatalf("after a request without keep_alive: releaseAt = %s, want 1m3s (the idle timeout again)", got)
	}
}

// A reload's idle timeout applies at once to the engine loaded, from its
// last request's end.
func TestIdleTimeoutOfAReloadAppliesAtOnce(t *testing.T) {
	s := loadedAt(Policy{}, "a", t0)
	if got := releaseAt(s); got != "none" {
		t.Fatalf("without an idle timeout: releaseAt = %s, want none", got)
	}
	s.Policy = idlePolicy
	if got := releaseAt(s); got != "1m0s" {
		t.Fatalf("after the reload: releaseAt = %s, want 1m0s", got)
	}
}

// keep_alive 0 releases as soon as the answer is complete: Next asks for it
// at the release's instant.
func TestKeepAliveZeroReleasesAtOnce(t *testing.T) {
	s := loadedAt(idlePolicy, "a", t0)
	mustArrive(t, s, waiter("a", 0, at(time.Second)), true)
	s.Release(at(2*time.Second), KeepAlive{Set: true, D: 0})
	if d := s.Next(at(2 * time.Second)); !d.Release {
		t.Fatalf("%+v, want a release at once", d)
	}
}

// A request that arrives as the release starts queues (the engine is
// going), and once the pool is empty it loads its profile again; after
// Ready the timer is the idle timeout again.
func TestRequestArrivingAsReleaseStarts(t *testing.T) {
	s := loadedAt(idlePolicy, "a", t0)
	if d := s.Next(at(time.Minute)); !d.Release {
		t.Fatalf("%+v, want a release", d)
	}
	s.Begin("")
	w := waiter("a", 0, at(time.Minute))
	mustArrive(t, s, w, false)
	if d := s.Next(at(time.Minute)); d.Release || d.Load != "" {
		t.Fatalf("during the release: %+v, want nothing", d)
	}
	if got := s.Ready("", at(61*time.Second)); len(got) != 0 {
		t.Fatalf("the release admitted %s", profiles(got))
	}
	d := s.Next(at(61 * time.Second))
	checkDecision(t, "after the release", d, nil, "a", time.Time{})
	s.Begin("a")
	if got := s.Ready("a", at(65*time.Second)); !sameWaiters(got, []*Waiter{w}) {
		t.Fatalf("the reload admitted %s, want the waiter", profiles(got))
	}
	s.Release(at(66*time.Second), KeepAlive{})
	if got := releaseAt(s); got != "2m6s" {
		t.Fatalf("releaseAt = %s, want 2m6s", got)
	}
}

// Nothing is released while requests wait, for the loaded profile (under
// its ceiling) or for another (a swap is coming), nor during a swap.
func TestNoIdleReleaseWhileRequestsWait(t *testing.T) {
	pol := idlePolicy
	pol.MaxInFlight = map[string]int{"a": 1}
	s := loadedAt(pol, "a", t0)
	mustArrive(t, s, waiter("a", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("a", 0, at(time.Second)), false)
	s.Release(at(2*time.Second), KeepAlive{Set: true, D: 0})
	if got := releaseAt(s); got != "none" {
		t.Fatalf("one waits for the slot: releaseAt = %s, want none", got)
	}
	if d := s.Next(at(2 * time.Second)); d.Release || len(d.Admit) != 1 {
		t.Fatalf("%+v, want the waiter admitted, no release", d)
	}

	s = loadedAt(idlePolicy, "a", t0)
	mustArrive(t, s, waiter("b", 0, at(time.Hour)), false)
	if d := s.Next(at(time.Hour)); d.Release || d.Load != "b" {
		t.Fatalf("another profile waits: %+v, want a swap to b", d)
	}
	s.Begin("b")
	if got := releaseAt(s); got != "none" {
		t.Fatalf("during a swap: releaseAt = %s, want none", got)
	}
}

// withIdle adds an idleTimeout to a profile's JSON.
func withIdle(prof, idle string) string {
	return strings.TrimSuffix(prof, "}") + `,"idleTimeout":"` + idle + `"}`
}

// An idle engine whose profile sleeps is put to sleep at its idleTimeout,
// one that does not is stopped; either way the pool is empty, the usage
// ledger's idle interval ends there (the activity goes from idle through
// the release to asleep or empty), the observer counts the release with
// its action, and a request brings the engine back.
func TestIdleReleaseSleepOrStop(t *testing.T) {
	plain := strings.Replace(sleepProfile("y"), `"sleep":{"level":1},`, "", 1)
	for _, tt := range []struct {
		name, prof, action, end string
	}{
		{"sleep", withIdle(sleepProfile("x"), "1s"), "x:sleep", "a/[0]/asleep:x"},
		{"stop", withIdle(strings.ReplaceAll(plain, `"y"`, `"x"`), "1s"), "x:stop", "a/[0]/empty:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := reloadConfig(t, sleepPool, tt.prof)
			log, obs := &activityLog{}, &exitObserver{}
			s, _ := runSleepSet(t, cfg, Options{Activity: log, Observer: obs})
			st := waitFor(t, s, "a", "x ready", readyWith("x"))
			if st.ReleaseAt == nil || st.ReleaseAction != tt.name {
				t.Fatalf("ready: releaseAt %v, action %q; want one, %q", st.ReleaseAt, st.ReleaseAction, tt.name)
			}
			log.waitActivity(t, tt.end)
			st = waitFor(t, s, "a", "empty", func(st statusapi.Pool) bool { return st.State == StateEmpty.String() })
			if st.Profile != nil || st.Engine != nil || st.ReleaseAt != nil {
				t.Fatalf("released: %+v, want no profile, engine or release due", st)
			}
			if got, want := strings.Join(log.take(), " "), "a/[0]/idle:x a/[0]/swapping: "+tt.end; !strings.HasSuffix(got, want) {
				t.Fatalf("activity %q, want it to end with %q", got, want)
			}
			obs.mu.Lock()
			releases := slices.Clone(obs.releases)
			obs.mu.Unlock()
			if !slices.Equal(releases, []string{tt.action}) {
				t.Fatalf("releases %v, want [%s]", releases, tt.action)
			}
			l := acquire(t, s, cfg, "x")
			if st := s.Pool("a").Status(); st.ReleaseAt != nil {
				t.Errorf("a request in flight, releaseAt %v, want none", st.ReleaseAt)
			}
			l.Release()
		})
	}
}
