package pool

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The scheduler is driven here by hand with a fake clock: t0 plus offsets. No
// sleeps, goroutines or processes.

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func waiter(profile string, prio int, arrived time.Time) *Waiter {
	return &Waiter{Profile: profile, Priority: prio, Arrived: arrived}
}

// loadedAt returns a scheduler with policy pol whose pool has profile ready
// since readyAt, nobody in flight and nobody waiting.
func loadedAt(pol Policy, profile string, readyAt time.Time) *Scheduler {
	s := &Scheduler{Policy: pol}
	s.Begin(profile)
	if got := s.Ready(profile, readyAt); len(got) != 0 {
		panic("fresh scheduler admitted waiters")
	}
	return s
}

// mustArrive queues or admits w and checks which one happened.
func mustArrive(t *testing.T, s *Scheduler, w *Waiter, wantAdmit bool) {
	t.Helper()
	ok, err := s.Arrive(w)
	if err != nil {
		t.Fatalf("Arrive(%s@%v): %v", w.Profile, w.Arrived.Sub(t0), err)
	}
	if ok != wantAdmit {
		t.Fatalf("Arrive(%s@%v) admitted = %v, want %v (loaded %q, closing %v, queue %d)",
			w.Profile, w.Arrived.Sub(t0), ok, wantAdmit, s.Loaded(), s.Closing(), s.QueueLen())
	}
}

func profiles(ws []*Waiter) string {
	var b []string
	for _, w := range ws {
		b = append(b, w.Profile)
	}
	return strings.Join(b, ",")
}

func sameWaiters(a, b []*Waiter) bool {
	return slices.Equal(a, b)
}

func checkDecision(t *testing.T, what string, d Decision, admit []*Waiter, load string, recheck time.Time) {
	t.Helper()
	if !sameWaiters(d.Admit, admit) {
		t.Errorf("%s: Admit = [%s] (%d), want [%s] (%d)", what, profiles(d.Admit), len(d.Admit), profiles(admit), len(admit))
	}
	if d.Load != load {
		t.Errorf("%s: Load = %q, want %q", what, d.Load, load)
	}
	if !d.Recheck.Equal(recheck) {
		t.Errorf("%s: Recheck = %v, want %v", what, offset(d.Recheck), offset(recheck))
	}
}

func offset(tm time.Time) string {
	if tm.IsZero() {
		return "none"
	}
	return "t0+" + tm.Sub(t0).String()
}

// ---------------------------------------------------------------------------
// A small discrete-event simulation of one pool around the scheduler, faithful
// to Pool.run: the loop calls Next after every wake (a queued arrival, a release,
// a cancel, a finished swap) and at the last Recheck it was given; a Load is
// followed by Begin, then Ready (or Failed) swapTime later; admitted waiters hold
// a lease until they Release it.

type simClient struct {
	name     string
	profiles []string // requested in turn
	priority int
	service  time.Duration // how long each lease is held
	think    time.Duration // from a release to the next request (closed loop)
	loop     bool          // closed loop: each release is followed by a new request
	start    time.Time     // first request

	next     time.Time // next request; zero when none is pending
	waiter   *Waiter   // the queued request, if any
	leaseEnd time.Time // zero when the client holds no lease
	n        int       // requests made

	served, failed, refused int
	waits                   []time.Duration
	admitted                []time.Time
}

type simulator struct {
	t        *testing.T
	s        *Scheduler
	now      time.Time
	swapTime time.Duration
	fail     map[string]bool // profiles whose load fails

	loading  string
	loadDone time.Time
	recheck  time.Time

	swaps   int
	loads   []string    // profiles loaded, in order
	loadAt  []time.Time // when each load was decided
	admits  []string    // "client:profile" in admission order
	clients []*simClient
	owner   map[*Waiter]*simClient
}

func newSim(t *testing.T, pol Policy, loaded string, swapTime time.Duration, clients ...*simClient) *simulator {
	sim := &simulator{
		t:        t,
		s:        loadedAt(pol, loaded, t0),
		now:      t0,
		swapTime: swapTime,
		clients:  clients,
		owner:    make(map[*Waiter]*simClient),
	}
	for _, c := range clients {
		if c.start.IsZero() {
			c.start = t0
		}
		c.next = c.start
	}
	return sim
}

// wake runs one iteration of the pool loop.
func (m *simulator) wake() {
	m.t.Helper()
	d := m.s.Next(m.now)
	for _, w := range d.Admit {
		m.grant(w)
	}
	m.recheck = d.Recheck
	if !d.Recheck.IsZero() && !d.Recheck.After(m.now) {
		m.t.Fatalf("at %s: Recheck %s is not in the future", offset(m.now), offset(d.Recheck))
	}
	if d.Load != "" {
		if n := m.leases(); n != 0 || m.s.InFlight() != 0 {
			m.t.Fatalf("at %s: Load %q with %d leases open (scheduler counts %d): no drain before swap",
				offset(m.now), d.Load, n, m.s.InFlight())
		}
		if len(d.Admit) != 0 {
			m.t.Fatalf("at %s: Load %q together with admissions", offset(m.now), d.Load)
		}
		m.s.Begin(d.Load)
		m.loading, m.loadDone = d.Load, m.now.Add(m.swapTime)
		m.swaps++
		m.loads = append(m.loads, d.Load)
		m.loadAt = append(m.loadAt, m.now)
	}
}

func (m *simulator) leases() int {
	n := 0
	for _, c := range m.clients {
		if !c.leaseEnd.IsZero() {
			n++
		}
	}
	return n
}

func (m *simulator) grant(w *Waiter) {
	m.t.Helper()
	c := m.owner[w]
	if c == nil || c.waiter != w {
		m.t.Fatalf("at %s: admitted a waiter (%s) that is not queued", offset(m.now), w.Profile)
	}
	if w.Profile != m.s.Loaded() {
		m.t.Fatalf("at %s: admitted %s while %q is loaded", offset(m.now), w.Profile, m.s.Loaded())
	}
	delete(m.owner, w)
	c.waiter = nil
	c.leaseEnd = m.now.Add(c.service)
	c.waits = append(c.waits, m.now.Sub(w.Arrived))
	c.admitted = append(c.admitted, m.now)
	m.admits = append(m.admits, c.name+":"+w.Profile)
}

func (m *simulator) arrive(c *simClient) {
	m.t.Helper()
	c.next = time.Time{}
	w := waiter(c.profiles[c.n%len(c.profiles)], c.priority, m.now)
	c.n++
	ok, err := m.s.Arrive(w)
	if err != nil {
		c.refused++
		if c.loop {
			c.next = m.now.Add(c.think + time.Second)
		}
		return
	}
	c.waiter = w
	m.owner[w] = c
	if ok {
		m.grant(w)
		return
	}
	m.wake()
}

// run advances the clock event by event until end.
func (m *simulator) run(end time.Time) {
	m.t.Helper()
	for steps := 0; ; steps++ {
		if steps > 10_000_000 {
			m.t.Fatal("simulation does not progress")
		}
		for _, c := range m.clients {
			if !c.leaseEnd.IsZero() && !m.now.Before(c.leaseEnd) {
				c.leaseEnd = time.Time{}
				c.served++
				m.s.Release(m.now, KeepAlive{})
				m.wake()
				if c.loop {
					c.next = m.now.Add(c.think)
				}
			}
		}
		if m.loading != "" && !m.now.Before(m.loadDone) {
			p := m.loading
			m.loading = ""
			if m.fail[p] {
				for _, w := range m.s.Failed(p) {
					c := m.owner[w]
					delete(m.owner, w)
					c.waiter = nil
					c.failed++
					if c.loop {
						c.next = m.now.Add(c.think + time.Second)
					}
				}
			} else {
				for _, w := range m.s.Ready(p, m.now) {
					m.grant(w)
				}
			}
			m.wake()
		}
		for _, c := range m.clients {
			if !c.next.IsZero() && !m.now.Before(c.next) {
				m.arrive(c)
			}
		}
		if !m.recheck.IsZero() && !m.now.Before(m.recheck) {
			m.recheck = time.Time{}
			m.wake()
		}
		m.check()

		var nt time.Time
		earliest := func(x time.Time) {
			if !x.IsZero() && (nt.IsZero() || x.Before(nt)) {
				nt = x
			}
		}
		for _, c := range m.clients {
			earliest(c.leaseEnd)
			earliest(c.next)
		}
		if m.loading != "" {
			earliest(m.loadDone)
		}
		earliest(m.recheck)
		if nt.IsZero() || nt.After(end) {
			m.now = end
			return
		}
		m.now = nt
	}
}

func (m *simulator) check() {
	m.t.Helper()
	if got, want := m.s.InFlight(), m.leases(); got != want {
		m.t.Fatalf("at %s: scheduler counts %d in flight, clients hold %d leases", offset(m.now), got, want)
	}
	if m.s.Target() != "" && m.s.InFlight() != 0 {
		m.t.Fatalf("at %s: loading %q with %d leases open", offset(m.now), m.s.Target(), m.s.InFlight())
	}
	queued := 0
	for _, c := range m.clients {
		if c.waiter != nil {
			queued++
		}
	}
	if got := m.s.QueueLen(); got != queued {
		m.t.Fatalf("at %s: scheduler queues %d, clients wait with %d", offset(m.now), got, queued)
	}
}

// ---------------------------------------------------------------------------
// No starvation.

func TestNoStarvationUnderContinuousStream(t *testing.T) {
	const (
		minRes   = 60 * time.Second
		swapTime = 5 * time.Second
	)
	pol := Policy{MinResidency: minRes, IdleGrace: time.Second, PriorityAge: time.Minute}
	for _, tc := range []struct {
		name     string
		bArrives time.Duration
		services []time.Duration // one closed-loop A client each
	}{
		{"one A client, B early", 10 * time.Second, []time.Duration{3 * time.Second}},
		{"three A clients, B early", 10 * time.Second, []time.Duration{7 * time.Second, 3 * time.Second, 5 * time.Second}},
		{"three A clients, B at load", 0, []time.Duration{7 * time.Second, 3 * time.Second, 5 * time.Second}},
		{"long A leases", 30 * time.Second, []time.Duration{25 * time.Second, 40 * time.Second}},
		{"B after residency", 100 * time.Second, []time.Duration{7 * time.Second, 3 * time.Second, 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clients []*simClient
			var maxService time.Duration
			for i, d := range tc.services {
				clients = append(clients, &simClient{
					name: fmt.Sprintf("a%d", i), profiles: []string{"A"}, service: d, loop: true,
					start: at(time.Duration(i) * 100 * time.Millisecond), // staggered, so a lease is always open
				})
				maxService = max(maxService, d)
			}
			b := &simClient{name: "b", profiles: []string{"B"}, service: 2 * time.Second, start: at(tc.bArrives)}
			sim := newSim(t, pol, "A", swapTime, append(clients, b)...)
			sim.run(at(30 * time.Minute))

			if b.served != 1 || len(b.admitted) != 1 {
				t.Fatalf("B served %d times, admitted %d times; want 1 (loads %v)", b.served, len(b.admitted), sim.loads)
			}
			// The gate closes when the residency is over (or at once, if it is
			// over when B arrives); then at most one A lease per client runs out
			// and B loads.
			closeAt := at(max(minRes, tc.bArrives))
			if sim.loads[0] != "B" {
				t.Fatalf("first load = %q, want B", sim.loads[0])
			}
			if latest := closeAt.Add(maxService); sim.loadAt[0].After(latest) {
				t.Errorf("B's load decided at %s, want by %s (residency end + longest A lease)", offset(sim.loadAt[0]), offset(latest))
			}
			if latest := closeAt.Add(maxService + swapTime); b.admitted[0].After(latest) {
				t.Errorf("B admitted at %s, want by %s", offset(b.admitted[0]), offset(latest))
			}
			// Before B's swap, A kept the pool for its whole residency.
			if sim.loadAt[0].Before(closeAt) {
				t.Errorf("B loaded at %s, before the gate could close at %s", offset(sim.loadAt[0]), offset(closeAt))
			}
			// No A request was admitted after the gate closed and before B ran.
			for _, c := range clients {
				for _, a := range c.admitted {
					if !a.Before(closeAt) && a.Before(b.admitted[0]) {
						t.Errorf("%s admitted at %s, after the gate closed at %s and before B", c.name, offset(a), offset(closeAt))
					}
				}
			}
			// The stream of A is not starved either: A comes back and keeps serving.
			if len(sim.loads) != 2 || sim.loads[1] != "A" {
				t.Errorf("loads = %v, want [B A]", sim.loads)
			}
			for _, c := range clients {
				if c.served < int(20*time.Minute/c.service) {
					t.Errorf("%s served only %d requests of %v in 30 min", c.name, c.served, c.service)
				}
			}
		})
	}
}

// Without a residency the same stream hands over as soon as the leases drain:
// the bound above is the residency's doing, not an accident of the workload.
func TestNoStarvationWithoutResidency(t *testing.T) {
	a := &simClient{name: "a", profiles: []string{"A"}, service: 3 * time.Second, loop: true}
	b := &simClient{name: "b", profiles: []string{"B"}, service: 2 * time.Second, start: at(10 * time.Second)}
	sim := newSim(t, Policy{IdleGrace: time.Second}, "A", 5*time.Second, a, b)
	sim.run(at(time.Minute))
	// A's leases run 0-3, 3-6, 6-9, 9-12: B arrives at 10 and loads at 12.
	if len(sim.loadAt) == 0 || !sim.loadAt[0].Equal(at(12*time.Second)) || sim.loads[0] != "B" {
		t.Fatalf("loads %v at %v, want B at t0+12s", sim.loads, sim.loadAt)
	}
	if !b.admitted[0].Equal(at(17 * time.Second)) {
		t.Errorf("B admitted at %s, want t0+17s", offset(b.admitted[0]))
	}
}

// ---------------------------------------------------------------------------
// Bounded swaps under alternating demand.

func thrash(t *testing.T, pol Policy, think time.Duration) (*simulator, *simClient, *simClient) {
	a := &simClient{name: "a", profiles: []string{"A"}, service: 2 * time.Second, think: think, loop: true}
	b := &simClient{name: "b", profiles: []string{"B"}, service: 2 * time.Second, think: think, loop: true, start: at(500 * time.Millisecond)}
	sim := newSim(t, pol, "A", 5*time.Second, a, b)
	sim.run(at(30 * time.Minute))
	return sim, a, b
}

func TestBoundedSwapsUnderAlternatingDemand(t *testing.T) {
	const minRes = 60 * time.Second
	policy := Policy{MinResidency: minRes, IdleGrace: DefaultIdleGrace, PriorityAge: DefaultPriorityAge}
	naive := Policy{} // residency 0, no idle grace: plain FIFO

	sim, a, b := thrash(t, policy, 0)
	bound := int(30*time.Minute/minRes) + 1
	if sim.swaps > bound {
		t.Errorf("policy: %d swaps in 30 min, want ≤ %d", sim.swaps, bound)
	}
	if sim.swaps < bound/2 {
		t.Errorf("policy: only %d swaps: one client was starved? (a %d, b %d served)", sim.swaps, a.served, b.served)
	}
	// Each client gets the pool about half of the time, 2 s a request.
	for _, c := range []*simClient{a, b} {
		if c.served < 300 {
			t.Errorf("policy: client %s served %d requests, want ≥ 300", c.name, c.served)
		}
		if c.refused != 0 || c.failed != 0 {
			t.Errorf("policy: client %s refused %d, failed %d", c.name, c.refused, c.failed)
		}
		for _, w := range c.waits {
			// A request that queues when the gate closes waits for the drain,
			// the swap away, the other profile's residency and last lease, and
			// the swap back.
			if limit := minRes + 2*(2*time.Second+5*time.Second); w > limit {
				t.Errorf("policy: client %s waited %v, more than %v", c.name, w, limit)
				break
			}
		}
	}

	base, ba, bb := thrash(t, naive, 0)
	// The baseline swaps once per request: every 2 s lease is followed by a 5 s swap.
	if base.swaps < 8*sim.swaps || base.swaps < 250 {
		t.Errorf("baseline: %d swaps, policy %d: want the baseline to swap ≥ 8× more and ≥ 250 times", base.swaps, sim.swaps)
	}
	if d := ba.served - base.swaps/2; d < -2 || d > 2 {
		t.Errorf("baseline: a served %d with %d swaps: want one swap per request", ba.served, base.swaps)
	}
	served, baseServed := a.served+b.served, ba.served+bb.served
	if served < 3*baseServed {
		t.Errorf("policy served %d requests, baseline %d: want ≥ 3× more", served, baseServed)
	}
	t.Logf("30 min, swap 5 s, lease 2 s: policy %d swaps %d served; FIFO baseline %d swaps %d served",
		sim.swaps, served, base.swaps, baseServed)

	// Residency alone is not enough: with no idle grace the pool sees the
	// loaded profile idle between a release and the next request and swaps.
	noGrace, _, _ := thrash(t, Policy{MinResidency: minRes}, 0)
	if noGrace.swaps < 8*sim.swaps {
		t.Errorf("residency without idle grace: %d swaps, want the thrash of the baseline (policy %d)", noGrace.swaps, sim.swaps)
	}
	// A client that thinks for less than the idle grace keeps its model.
	think, _, _ := thrash(t, policy, 500*time.Millisecond)
	if think.swaps > bound {
		t.Errorf("policy with 0.5 s think time: %d swaps, want ≤ %d", think.swaps, bound)
	}
}

// ---------------------------------------------------------------------------
// Batching.

func TestBatchingReleasesAllWaitersOfAProfileTogether(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second, PriorityAge: time.Minute}
	s := loadedAt(pol, "A", t0)
	a := waiter("A", 0, at(time.Second))
	mustArrive(t, s, a, true)

	b1, c1, b2, c2, b3 := waiter("B", 0, at(2*time.Second)), waiter("C", 0, at(3*time.Second)),
		waiter("B", 0, at(4*time.Second)), waiter("C", 0, at(5*time.Second)), waiter("B", 0, at(6*time.Second))
	for _, w := range []*Waiter{b1, c1, b2, c2, b3} {
		mustArrive(t, s, w, false)
		checkDecision(t, "during residency with A in flight", s.Next(w.Arrived), nil, "", at(time.Minute))
	}
	// The residency ends: the gate closes, the A lease drains, B (oldest) loads.
	checkDecision(t, "residency over", s.Next(at(time.Minute)), nil, "", time.Time{})
	if !s.Closing() {
		t.Fatal("gate open after the residency with others waiting")
	}
	s.Release(at(70*time.Second), KeepAlive{})
	checkDecision(t, "drained", s.Next(at(70*time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	b4 := waiter("B", 0, at(72*time.Second)) // arrives while B loads
	mustArrive(t, s, b4, false)
	checkDecision(t, "while loading", s.Next(at(72*time.Second)), nil, "", time.Time{})

	got := s.Ready("B", at(75*time.Second))
	if want := []*Waiter{b1, b2, b3, b4}; !sameWaiters(got, want) {
		t.Fatalf("Ready(B) admitted [%s] (%d), want all four B waiters in arrival order", profiles(got), len(got))
	}
	if s.InFlight() != 4 {
		t.Errorf("InFlight = %d, want 4", s.InFlight())
	}
	if n, _ := s.Waiting(); n["C"] != 2 || len(n) != 1 {
		t.Errorf("Waiting = %v, want C:2 only", n)
	}
	// While B holds the pool a later B request is admitted straight away.
	mustArrive(t, s, waiter("B", 0, at(76*time.Second)), true)
	for range 5 {
		s.Release(at(80*time.Second), KeepAlive{})
	}
	// B is idle once its grace has passed; then C's two waiters load and are
	// released together: two swaps in all for B B B B C C, not one per request.
	checkDecision(t, "B idle within grace", s.Next(at(80*time.Second)), nil, "", at(81*time.Second))
	checkDecision(t, "B idle", s.Next(at(81*time.Second)), nil, "C", time.Time{})
	s.Begin("C")
	if got := s.Ready("C", at(86*time.Second)); !sameWaiters(got, []*Waiter{c1, c2}) {
		t.Fatalf("Ready(C) admitted [%s], want both C waiters", profiles(got))
	}
	if s.QueueLen() != 0 {
		t.Errorf("QueueLen = %d, want 0", s.QueueLen())
	}
}

// When the pool drains towards a swap and the loaded profile's own waiters turn
// out to be first, they are admitted together, without a swap.
func TestBatchingWhenLoadedProfileGoesNext(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second, PriorityAge: time.Minute}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	b := waiter("B", 0, at(70*time.Second))
	mustArrive(t, s, b, false)
	checkDecision(t, "B waits, residency over", s.Next(at(70*time.Second)), nil, "", time.Time{})
	// A high-priority A stream queues behind the closed gate.
	a1, a2 := waiter("A", 2, at(71*time.Second)), waiter("A", 2, at(72*time.Second))
	mustArrive(t, s, a1, false)
	mustArrive(t, s, a2, false)
	s.Release(at(73*time.Second), KeepAlive{})
	checkDecision(t, "drained, A's waiters outrank B", s.Next(at(73*time.Second)), []*Waiter{a1, a2}, "", time.Time{})
	if s.Closing() {
		t.Error("gate still closed after the loaded profile went next")
	}
	if s.Loaded() != "A" || s.InFlight() != 2 || !s.Queued("B") {
		t.Errorf("loaded %q, in flight %d, B queued %v; want A, 2, true", s.Loaded(), s.InFlight(), s.Queued("B"))
	}
}

// ---------------------------------------------------------------------------
// Priority with ageing.

func TestPickPriorityWithAgeing(t *testing.T) {
	const age = time.Minute
	for _, tc := range []struct {
		name string
		ws   []*Waiter
		want string
	}{
		{"FIFO at equal priority", []*Waiter{waiter("L", 0, at(10*time.Second)), waiter("H", 0, at(20*time.Second))}, "L"},
		{"FIFO keeps queue order on a tie", []*Waiter{waiter("L", 0, at(10*time.Second)), waiter("H", 0, at(10*time.Second))}, "L"},
		{"higher priority overtakes an older waiter", []*Waiter{waiter("L", 0, at(0)), waiter("H", 1, at(59*time.Second))}, "H"},
		{"low priority that waited longer than one level goes first", []*Waiter{waiter("L", 0, at(0)), waiter("H", 1, at(61*time.Second))}, "L"},
		{"exactly one level older: arrival order", []*Waiter{waiter("L", 0, at(0)), waiter("H", 1, at(60*time.Second))}, "L"},
		{"two levels are worth two minutes", []*Waiter{waiter("L", 0, at(0)), waiter("H", 2, at(119*time.Second))}, "H"},
		{"two levels, low waited longer", []*Waiter{waiter("L", 0, at(0)), waiter("H", 2, at(121*time.Second))}, "L"},
		{"negative priority yields", []*Waiter{waiter("N", -1, at(0)), waiter("Z", 0, at(59*time.Second))}, "Z"},
		{"negative priority ages too", []*Waiter{waiter("N", -1, at(0)), waiter("Z", 0, at(61*time.Second))}, "N"},
		{"difference counts, not level", []*Waiter{waiter("L", 3, at(0)), waiter("H", 4, at(61*time.Second))}, "L"},
		{"oldest waiter of a profile decides", []*Waiter{waiter("H", 1, at(100*time.Second)), waiter("L", 0, at(30*time.Second)), waiter("H", 1, at(0))}, "H"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Drive it the way the pool does: X is loaded with a lease in
			// flight past its residency; the waiters queue; the lease ends.
			s := loadedAt(Policy{MinResidency: time.Second, PriorityAge: age}, "X", t0)
			mustArrive(t, s, waiter("X", 0, t0), true)
			for _, w := range tc.ws {
				mustArrive(t, s, w, false)
			}
			now := at(10 * time.Minute)
			checkDecision(t, "lease open", s.Next(now), nil, "", time.Time{})
			s.Release(now, KeepAlive{})
			checkDecision(t, "drained", s.Next(now), nil, tc.want, time.Time{})
		})
	}
}

// The same ordering decides between waiting profiles on an empty pool, and
// after a swap the next one is chosen again by ageing.
func TestPriorityAgeingAcrossSwaps(t *testing.T) {
	pol := Policy{PriorityAge: time.Minute}
	s := &Scheduler{Policy: pol}
	low := waiter("L", 0, at(0))
	high1 := waiter("H", 1, at(30*time.Second))
	mustArrive(t, s, low, false)
	mustArrive(t, s, high1, false)
	checkDecision(t, "empty pool", s.Next(at(30*time.Second)), nil, "H", time.Time{})
	s.Begin("H")
	high2 := waiter("H", 1, at(100*time.Second)) // arrives during the load: batched
	mustArrive(t, s, high2, false)
	if got := s.Ready("H", at(120*time.Second)); !sameWaiters(got, []*Waiter{high1, high2}) {
		t.Fatalf("Ready(H) = [%s]", profiles(got))
	}
	// A third H arrives after L has waited more than one level: L goes next
	// even though H is loaded and of higher priority.
	s.Release(at(130*time.Second), KeepAlive{})
	high3 := waiter("H", 1, at(131*time.Second))
	mustArrive(t, s, high3, false) // gate closed: residency 0 and L waits
	s.Release(at(132*time.Second), KeepAlive{})
	checkDecision(t, "L aged past H", s.Next(at(132*time.Second)), nil, "L", time.Time{})
}

// ---------------------------------------------------------------------------
// Queue overflow and cancellation.

func TestQueueOverflow(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Minute, IdleGrace: time.Second, MaxQueue: 3}, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	ws := []*Waiter{waiter("B", 0, at(2*time.Second)), waiter("C", 0, at(3*time.Second)), waiter("B", 0, at(4*time.Second))}
	for _, w := range ws {
		mustArrive(t, s, w, false)
	}
	over := waiter("C", 0, at(5*time.Second))
	if ok, err := s.Arrive(over); ok || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Arrive at MaxQueue = %v, %v; want false, ErrQueueFull", ok, err)
	}
	if s.QueueLen() != 3 || s.Queued("C") != true {
		t.Fatalf("QueueLen = %d after a refusal, want 3", s.QueueLen())
	}
	// A refused waiter is not queued: cancelling it finds nothing.
	if s.Cancel(over) {
		t.Error("Cancel of a refused waiter = true")
	}
	// Requests the gate admits at once do not need a place in the queue.
	mustArrive(t, s, waiter("A", 0, at(6*time.Second)), true)
	// A waiter that leaves (client gone, or its maxQueueWait ran out) frees its place.
	if !s.Cancel(ws[1]) {
		t.Fatal("Cancel of a queued waiter = false")
	}
	if s.QueueLen() != 2 || s.Queued("C") {
		t.Fatalf("after Cancel: QueueLen %d, C queued %v; want 2, false", s.QueueLen(), s.Queued("C"))
	}
	mustArrive(t, s, over, false)
	if _, err := s.Arrive(waiter("D", 0, at(7*time.Second))); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Arrive with the freed place taken again = %v, want ErrQueueFull", err)
	}
	// Admission frees places too.
	for range 2 {
		s.Release(at(70*time.Second), KeepAlive{})
	}
	checkDecision(t, "drained", s.Next(at(70*time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	if got := s.Ready("B", at(75*time.Second)); len(got) != 2 {
		t.Fatalf("Ready(B) admitted %d, want 2", len(got))
	}
	mustArrive(t, s, waiter("D", 0, at(76*time.Second)), false)
	mustArrive(t, s, waiter("D", 0, at(76*time.Second)), false)
	if _, err := s.Arrive(waiter("D", 0, at(76*time.Second))); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("fourth waiter: %v, want ErrQueueFull", err)
	}
}

func TestQueueUnboundedWithZeroMaxQueue(t *testing.T) {
	s := &Scheduler{}
	for i := range 1000 {
		mustArrive(t, s, waiter("B", 0, at(time.Duration(i))), false)
	}
	if s.QueueLen() != 1000 {
		t.Fatalf("QueueLen = %d", s.QueueLen())
	}
}

func TestCancel(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	b1, b2, c := waiter("B", 0, at(time.Second)), waiter("B", 0, at(2*time.Second)), waiter("C", 0, at(3*time.Second))
	for _, w := range []*Waiter{b1, c, b2} {
		mustArrive(t, s, w, false)
	}
	if !s.Cancel(b1) {
		t.Fatal("Cancel(queued) = false")
	}
	if s.Cancel(b1) {
		t.Error("second Cancel = true")
	}
	if n, oldest := s.Waiting(); n["B"] != 1 || n["C"] != 1 || !oldest.Equal(at(2*time.Second)) {
		t.Errorf("Waiting = %v, oldest %s; want B:1 C:1, t0+2s", n, offset(oldest))
	}
	// A is idle, so the oldest remaining waiter (b2, not the cancelled b1) loads.
	checkDecision(t, "idle", s.Next(at(10*time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	if got := s.Ready("B", at(15*time.Second)); !sameWaiters(got, []*Waiter{b2}) {
		t.Fatalf("Ready(B) = [%s] (%d), want only b2", profiles(got), len(got))
	}
	if s.Cancel(b2) {
		t.Error("Cancel of an admitted waiter = true")
	}
	if s.InFlight() != 1 {
		t.Errorf("InFlight = %d, want 1 (Cancel of an admitted waiter must not touch it)", s.InFlight())
	}
	// Failed waiters are no longer queued either.
	s.Release(at(16*time.Second), KeepAlive{})
	checkDecision(t, "B idle", s.Next(at(17*time.Second)), nil, "C", time.Time{})
	s.Begin("C")
	if got := s.Failed("C"); !sameWaiters(got, []*Waiter{c}) {
		t.Fatalf("Failed(C) = [%s]", profiles(got))
	}
	if s.Cancel(c) {
		t.Error("Cancel of a failed waiter = true")
	}
}

// A demand for B that is cancelled before its swap causes no swap: the gate
// reopens for A's waiters.
func TestCancelledDemandCausesNoSwap(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}

	t.Run("during residency", func(t *testing.T) {
		s := loadedAt(pol, "A", t0)
		mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
		b := waiter("B", 0, at(2*time.Second))
		mustArrive(t, s, b, false)
		checkDecision(t, "B waits", s.Next(at(2*time.Second)), nil, "", at(time.Minute))
		s.Cancel(b)
		checkDecision(t, "B gone", s.Next(at(3*time.Second)), nil, "", time.Time{})
		s.Release(at(4*time.Second), KeepAlive{})
		checkDecision(t, "A released", s.Next(at(70*time.Second)), nil, "", time.Time{})
		if s.Loaded() != "A" || s.Closing() {
			t.Errorf("loaded %q closing %v, want A open", s.Loaded(), s.Closing())
		}
		mustArrive(t, s, waiter("A", 0, at(71*time.Second)), true)
	})

	t.Run("gate closed, drained", func(t *testing.T) {
		s := loadedAt(pol, "A", t0)
		mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
		b := waiter("B", 0, at(70*time.Second))
		mustArrive(t, s, b, false)
		checkDecision(t, "gate closes", s.Next(at(70*time.Second)), nil, "", time.Time{})
		a := waiter("A", 0, at(71*time.Second))
		mustArrive(t, s, a, false)
		s.Cancel(b)
		s.Release(at(72*time.Second), KeepAlive{})
		checkDecision(t, "only A waits", s.Next(at(72*time.Second)), []*Waiter{a}, "", time.Time{})
		if s.Closing() || s.Loaded() != "A" {
			t.Errorf("closing %v loaded %q, want open, A", s.Closing(), s.Loaded())
		}
		mustArrive(t, s, waiter("A", 0, at(73*time.Second)), true)
	})

	// The gate closed for B and A's requests queued behind it; B leaves while
	// an A lease is still open. Nothing is left to drain for: A's waiters are
	// admitted at once and the gate reopens, rather than stalling A until the
	// open lease ends.
	t.Run("gate closed, lease open", func(t *testing.T) {
		s := loadedAt(pol, "A", t0)
		mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
		b := waiter("B", 0, at(70*time.Second))
		mustArrive(t, s, b, false)
		checkDecision(t, "gate closes", s.Next(at(70*time.Second)), nil, "", time.Time{})
		a := waiter("A", 0, at(71*time.Second))
		mustArrive(t, s, a, false)
		s.Cancel(b)
		checkDecision(t, "only A waits", s.Next(at(72*time.Second)), []*Waiter{a}, "", time.Time{})
		if s.Closing() {
			t.Error("gate still closed with nobody waiting for another profile")
		}
		mustArrive(t, s, waiter("A", 0, at(73*time.Second)), true)
		if s.InFlight() != 3 {
			t.Errorf("InFlight = %d, want 3", s.InFlight())
		}
	})

	// The gate closed for B and B left: with nobody waiting at all the gate
	// reopens too, so the next A request is not queued behind a drain.
	t.Run("gate closed, queue empty", func(t *testing.T) {
		s := loadedAt(pol, "A", t0)
		mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
		b := waiter("B", 0, at(70*time.Second))
		mustArrive(t, s, b, false)
		checkDecision(t, "gate closes", s.Next(at(70*time.Second)), nil, "", time.Time{})
		s.Cancel(b)
		checkDecision(t, "nobody waits", s.Next(at(71*time.Second)), nil, "", time.Time{})
		if s.Closing() {
			t.Error("gate still closed with nobody waiting")
		}
		mustArrive(t, s, waiter("A", 0, at(72*time.Second)), true)
	})

	// In the simulation: B's client leaves before its swap; A's client is not
	// interrupted and there is no swap at all.
	t.Run("simulated", func(t *testing.T) {
		a := &simClient{name: "a", profiles: []string{"A"}, service: 3 * time.Second, loop: true}
		sim := newSim(t, pol, "A", 5*time.Second, a)
		sim.run(at(65 * time.Second))
		b := waiter("B", 0, sim.now)
		mustArrive(t, sim.s, b, false)
		sim.wake()
		if !sim.s.Closing() {
			t.Fatal("gate open after the residency with B waiting")
		}
		sim.s.Cancel(b)
		sim.wake()
		sim.run(at(10 * time.Minute))
		if sim.swaps != 0 {
			t.Errorf("swaps = %d (%v), want 0", sim.swaps, sim.loads)
		}
		for i, w := range a.waits {
			if w != 0 {
				t.Errorf("A request %d waited %v, want 0", i, w)
				break
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Idle grace and Recheck.

func TestIdleGraceSwapsBeforeResidencyEnds(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	s.Release(at(2*time.Second), KeepAlive{})
	b := waiter("B", 0, at(2500*time.Millisecond))
	mustArrive(t, s, b, false)
	// A was used 0.5 s ago: still in demand until t0+3s.
	checkDecision(t, "within grace", s.Next(at(2500*time.Millisecond)), nil, "", at(3*time.Second))
	// A request for A within the grace is served and pushes the idle time on.
	mustArrive(t, s, waiter("A", 0, at(2800*time.Millisecond)), true)
	checkDecision(t, "A busy", s.Next(at(2800*time.Millisecond)), nil, "", at(time.Minute))
	s.Release(at(4*time.Second), KeepAlive{})
	checkDecision(t, "released", s.Next(at(4*time.Second)), nil, "", at(5*time.Second))
	checkDecision(t, "idle", s.Next(at(5*time.Second)), nil, "B", time.Time{})
	if at(5 * time.Second).After(at(pol.MinResidency)) {
		t.Fatal("test is wrong")
	}
	s.Begin("B")
	if got := s.Ready("B", at(10*time.Second)); !sameWaiters(got, []*Waiter{b}) {
		t.Fatalf("Ready(B) = [%s]", profiles(got))
	}
}

func TestRecheck(t *testing.T) {
	const minRes, grace = time.Minute, time.Second
	for _, tc := range []struct {
		name     string
		inFlight int
		lastUsed time.Duration // since t0; the profile was ready at t0
		now      time.Duration
		load     string
		recheck  time.Duration // 0: none
		closing  bool
	}{
		{"lease open: at residency end", 1, 5 * time.Second, 10 * time.Second, "", minRes, false},
		{"idle soon: at idle time", 0, 5 * time.Second, 5500 * time.Millisecond, "", 6 * time.Second, false},
		{"idle already: swap now", 0, 5 * time.Second, 6 * time.Second, "B", 0, true},
		{"idle exactly at grace end", 0, 5 * time.Second, 6 * time.Second, "B", 0, true},
		{"idle after residency end: at residency end", 0, 59500 * time.Millisecond, 59700 * time.Millisecond, "", minRes, false},
		{"residency over, drained: swap", 0, 59500 * time.Millisecond, minRes, "B", 0, true},
		{"residency over, lease open: drain, no recheck", 2, 59500 * time.Millisecond, minRes, "", 0, true},
		{"just before residency end", 1, 0, minRes - time.Nanosecond, "", minRes, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := loadedAt(Policy{MinResidency: minRes, IdleGrace: grace}, "A", t0)
			for range tc.inFlight {
				mustArrive(t, s, waiter("A", 0, at(tc.lastUsed)), true)
			}
			if tc.inFlight == 0 && tc.lastUsed > 0 {
				mustArrive(t, s, waiter("A", 0, at(tc.lastUsed-time.Millisecond)), true)
				s.Release(at(tc.lastUsed), KeepAlive{})
			}
			mustArrive(t, s, waiter("B", 0, at(tc.now)), false)
			var want time.Time
			if tc.recheck != 0 {
				want = at(tc.recheck)
			}
			checkDecision(t, tc.name, s.Next(at(tc.now)), nil, tc.load, want)
			if s.Closing() != tc.closing && tc.load == "" {
				t.Errorf("Closing = %v, want %v", s.Closing(), tc.closing)
			}
		})
	}
}

func TestNextDoesNothingWithoutWaitersOrDuringALoad(t *testing.T) {
	s := loadedAt(Policy{}, "A", t0)
	checkDecision(t, "nobody waits", s.Next(at(time.Hour)), nil, "", time.Time{})
	s = &Scheduler{}
	checkDecision(t, "empty pool", s.Next(t0), nil, "", time.Time{})
	mustArrive(t, s, waiter("B", 0, t0), false)
	checkDecision(t, "empty pool, B waits", s.Next(t0), nil, "B", time.Time{})
	s.Begin("B")
	mustArrive(t, s, waiter("C", 0, t0), false)
	for i := range 3 {
		checkDecision(t, fmt.Sprintf("loading (%d)", i), s.Next(at(time.Duration(i)*time.Hour)), nil, "", time.Time{})
	}
	if s.Target() != "B" || s.Loaded() != "" {
		t.Errorf("target %q loaded %q, want B, none", s.Target(), s.Loaded())
	}
}

// ---------------------------------------------------------------------------
// Failed, Lost, drain before swap.

func TestFailedReturnsOnlyThatProfilesWaiters(t *testing.T) {
	s := &Scheduler{Policy: Policy{MinResidency: time.Minute, IdleGrace: time.Second}}
	b1, c1, b2, c2 := waiter("B", 0, at(1)), waiter("C", 0, at(2)), waiter("B", 0, at(3)), waiter("C", 0, at(4))
	for _, w := range []*Waiter{b1, c1, b2, c2} {
		mustArrive(t, s, w, false)
	}
	checkDecision(t, "empty", s.Next(at(5)), nil, "B", time.Time{})
	s.Begin("B")
	b3 := waiter("B", 0, at(6))
	mustArrive(t, s, b3, false)
	got := s.Failed("B")
	if !sameWaiters(got, []*Waiter{b1, b2, b3}) {
		t.Fatalf("Failed(B) = [%s] (%d), want the three B waiters", profiles(got), len(got))
	}
	if s.Loaded() != "" || s.Target() != "" || s.Closing() || s.InFlight() != 0 {
		t.Errorf("after Failed: loaded %q target %q closing %v in flight %d", s.Loaded(), s.Target(), s.Closing(), s.InFlight())
	}
	if n, oldest := s.Waiting(); n["C"] != 2 || len(n) != 1 || !oldest.Equal(at(2)) {
		t.Errorf("Waiting = %v oldest %s, want C:2 since t0+2ns", n, offset(oldest))
	}
	checkDecision(t, "after failure", s.Next(at(7)), nil, "C", time.Time{})
	s.Begin("C")
	if got := s.Ready("C", at(8)); !sameWaiters(got, []*Waiter{c1, c2}) {
		t.Fatalf("Ready(C) = [%s]", profiles(got))
	}
}

// In the simulation a failing profile answers its waiters and the pool moves on.
func TestFailedLoadInSimulation(t *testing.T) {
	a := &simClient{name: "a", profiles: []string{"A"}, service: 2 * time.Second, loop: true}
	b := &simClient{name: "b", profiles: []string{"B"}, service: 2 * time.Second, start: at(10 * time.Second)}
	c := &simClient{name: "c", profiles: []string{"C"}, service: 2 * time.Second, start: at(11 * time.Second)}
	sim := newSim(t, Policy{MinResidency: 30 * time.Second, IdleGrace: time.Second}, "A", 5*time.Second, a, b, c)
	sim.fail = map[string]bool{"B": true}
	sim.run(at(5 * time.Minute))
	if b.failed != 1 || b.served != 0 {
		t.Errorf("B failed %d served %d, want 1, 0", b.failed, b.served)
	}
	if c.served != 1 {
		t.Errorf("C served %d, want 1", c.served)
	}
	if want := []string{"B", "C", "A"}; !slices.Equal(sim.loads, want) {
		t.Errorf("loads = %v, want %v", sim.loads, want)
	}
	// C loads right after B's failure, with no lease open.
	if len(sim.loadAt) > 1 && !sim.loadAt[1].Equal(sim.loadAt[0].Add(5*time.Second)) {
		t.Errorf("C loaded at %s, want as soon as B failed at %s", offset(sim.loadAt[1]), offset(sim.loadAt[0].Add(5*time.Second)))
	}
}

func TestLostLoadsOldestWaiterOnceDrained(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Hour, IdleGrace: time.Second}, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	c := waiter("C", 0, at(3*time.Second))
	b := waiter("B", 0, at(2*time.Second))
	mustArrive(t, s, b, false)
	mustArrive(t, s, c, false)
	s.Lost()
	if s.Loaded() != "" || s.Closing() {
		t.Fatalf("after Lost: loaded %q closing %v", s.Loaded(), s.Closing())
	}
	// A request for A after the loss is not admitted to a dead engine.
	a := waiter("A", 0, at(4*time.Second))
	mustArrive(t, s, a, false)
	checkDecision(t, "two leases open", s.Next(at(4*time.Second)), nil, "", time.Time{})
	s.Release(at(5*time.Second), KeepAlive{})
	checkDecision(t, "one lease open", s.Next(at(5*time.Second)), nil, "", time.Time{})
	s.Release(at(6*time.Second), KeepAlive{})
	// The residency of the lost engine no longer counts; B is the oldest waiter.
	checkDecision(t, "drained", s.Next(at(6*time.Second)), nil, "B", time.Time{})
}

func TestLostWithNoWaiters(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Hour, IdleGrace: time.Second}, "A", t0)
	s.Lost()
	checkDecision(t, "nobody waits", s.Next(at(time.Second)), nil, "", time.Time{})
	a := waiter("A", 0, at(2*time.Second))
	mustArrive(t, s, a, false)
	checkDecision(t, "A waits", s.Next(at(2*time.Second)), nil, "A", time.Time{})
	s.Begin("A")
	if got := s.Ready("A", at(3*time.Second)); !sameWaiters(got, []*Waiter{a}) {
		t.Fatalf("Ready(A) = [%s]", profiles(got))
	}
}

func TestNothingLoadsWhileLeasesAreOpen(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Minute, IdleGrace: time.Second}, "A", t0)
	for range 3 {
		mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	}
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	now := at(time.Minute)
	for i := 3; i > 0; i-- {
		if s.InFlight() != i {
			t.Fatalf("InFlight = %d, want %d", s.InFlight(), i)
		}
		checkDecision(t, fmt.Sprintf("%d leases open", i), s.Next(now), nil, "", time.Time{})
		if !s.Closing() {
			t.Fatal("gate open while draining")
		}
		// New A requests queue behind the closed gate.
		mustArrive(t, s, waiter("A", 0, now), false)
		now = now.Add(time.Second)
		s.Release(now, KeepAlive{})
	}
	checkDecision(t, "drained", s.Next(now), nil, "B", time.Time{})
	// The Load decision leaves the pool to Begin; a second Next before Begin
	// must not admit A's waiters to the engine being stopped.
	s.Begin("B")
	if s.Loaded() != "" || s.Target() != "B" {
		t.Fatalf("after Begin: loaded %q target %q", s.Loaded(), s.Target())
	}
	mustArrive(t, s, waiter("A", 0, now), false)
	if n, _ := s.Waiting(); n["A"] != 4 {
		t.Errorf("A waiting = %d, want 4", n["A"])
	}
}

// ---------------------------------------------------------------------------
// The gate.

func TestGateDuringAndAfterResidency(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true) // keeps A in demand
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	for _, d := range []time.Duration{3 * time.Second, 30 * time.Second, time.Minute - time.Nanosecond} {
		if s.gateClosed(at(d)) {
			t.Errorf("gate closed at %s, within the residency", offset(at(d)))
		}
		mustArrive(t, s, waiter("A", 0, at(d)), true)
	}
	if !s.gateClosed(at(time.Minute)) {
		t.Error("gate open at the end of the residency with B waiting")
	}
	mustArrive(t, s, waiter("A", 0, at(time.Minute)), false)
	if s.Closing() {
		t.Error("Closing before Next said so")
	}
	checkDecision(t, "residency over", s.Next(at(time.Minute)), nil, "", time.Time{})
	if !s.Closing() {
		t.Error("not Closing after Next at the residency end")
	}
	mustArrive(t, s, waiter("A", 0, at(2*time.Minute)), false)
	if n, _ := s.Waiting(); n["A"] != 2 || n["B"] != 1 {
		t.Errorf("Waiting = %v, want A:2 B:1", n)
	}
}

func TestGateOpenWithoutOtherDemand(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Minute, IdleGrace: time.Second}, "A", t0)
	for _, d := range []time.Duration{0, time.Minute, time.Hour} {
		if s.gateClosed(at(d)) {
			t.Errorf("gate closed at %s with nobody else waiting", offset(at(d)))
		}
		mustArrive(t, s, waiter("A", 0, at(d)), true)
	}
	// Waiting for the loaded profile itself does not close the gate.
	s2 := &Scheduler{Policy: Policy{MinResidency: time.Minute}}
	s2.Begin("A")
	a := waiter("A", 0, t0) // queued during the load
	mustArrive(t, s2, a, false)
	s2.Ready("A", t0)
	if s2.gateClosed(at(time.Hour)) {
		t.Error("gate closed with no other profile waiting")
	}
	// A request for a profile that is loading is not admitted before Ready.
	s3 := &Scheduler{}
	s3.Begin("A")
	mustArrive(t, s3, waiter("A", 0, t0), false)
}

func TestGateTable(t *testing.T) {
	const minRes = time.Minute
	for _, tc := range []struct {
		name    string
		others  bool
		closing bool
		now     time.Duration
		closed  bool
	}{
		{"residency, no others", false, false, 10 * time.Second, false},
		{"residency, others", true, false, 10 * time.Second, false},
		{"after residency, no others", false, false, 2 * minRes, false},
		{"after residency, others", true, false, 2 * minRes, true},
		{"at residency end, others", true, false, minRes, true},
		{"closing, residency", true, true, 10 * time.Second, true},
		{"closing, no others left", false, true, 10 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := loadedAt(Policy{MinResidency: minRes}, "A", t0)
			if tc.others {
				mustArrive(t, s, waiter("B", 0, t0), false)
			}
			s.closing = tc.closing
			if got := s.gateClosed(at(tc.now)); got != tc.closed {
				t.Errorf("gateClosed = %v, want %v", got, tc.closed)
			}
			ok, err := s.Arrive(waiter("A", 0, at(tc.now)))
			if err != nil || ok == tc.closed {
				t.Errorf("Arrive(A) = %v, %v; want admitted = %v", ok, err, !tc.closed)
			}
		})
	}
}

// After a swap the new profile gets its own residency even though the old
// profile's requests now wait.
func TestResidencyAfterSwap(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	s.Next(at(time.Minute))
	mustArrive(t, s, waiter("A", 0, at(61*time.Second)), false)
	s.Release(at(62*time.Second), KeepAlive{})
	checkDecision(t, "drained", s.Next(at(62*time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	if got := s.Ready("B", at(67*time.Second)); len(got) != 1 {
		t.Fatalf("Ready(B) admitted %d", len(got))
	}
	// A waits; B is in demand and resident until t0+67s+1m.
	checkDecision(t, "B resident", s.Next(at(68*time.Second)), nil, "", at(127*time.Second))
	mustArrive(t, s, waiter("B", 0, at(100*time.Second)), true)
	mustArrive(t, s, waiter("B", 0, at(127*time.Second)), false)
}

// ---------------------------------------------------------------------------
// Per-profile residency and explicit load/unload intents.

// A profile's own residency replaces the pool's while it is loaded.
func TestPerProfileResidency(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second,
		Residency: map[string]time.Duration{"big": 5 * time.Minute, "small": 0}}

	s := loadedAt(pol, "big", t0)
	mustArrive(t, s, waiter("big", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	checkDecision(t, "big resident", s.Next(at(2*time.Second)), nil, "", at(5*time.Minute))
	mustArrive(t, s, waiter("big", 0, at(2*time.Minute)), true) // past the pool's 1m, within its own 5m
	checkDecision(t, "big's residency over", s.Next(at(5*time.Minute)), nil, "", time.Time{})
	mustArrive(t, s, waiter("big", 0, at(5*time.Minute)), false)

	s = loadedAt(pol, "small", t0)
	mustArrive(t, s, waiter("small", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	mustArrive(t, s, waiter("small", 0, at(2*time.Second)), false) // residency 0: the gate closes at once
	s.Release(at(3*time.Second), KeepAlive{})
	checkDecision(t, "small drained", s.Next(at(3*time.Second)), nil, "B", time.Time{})

	s = loadedAt(pol, "other", t0) // not listed: the pool's minute
	mustArrive(t, s, waiter("other", 0, at(time.Second)), true)
	mustArrive(t, s, waiter("B", 0, at(2*time.Second)), false)
	checkDecision(t, "pool residency", s.Next(at(2*time.Second)), nil, "", at(time.Minute))
}

func intent(profile string, prio int, arrived time.Time) *Waiter {
	return &Waiter{Profile: profile, Priority: prio, Arrived: arrived, Intent: true}
}

// A load intent queues, closes the gate after the residency and drains the
// pool like a request for its profile; once loaded it holds no lease, so the
// profile it loaded has no demand beyond the idle grace.
func TestLoadIntentDrainsLikeASwap(t *testing.T) {
	pol := Policy{MinResidency: time.Minute, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	load := intent("B", 0, at(2*time.Second))
	mustArrive(t, s, load, false)
	checkDecision(t, "A resident", s.Next(at(3*time.Second)), nil, "", at(time.Minute))
	mustArrive(t, s, waiter("A", 0, at(30*time.Second)), true)
	checkDecision(t, "residency over", s.Next(at(time.Minute)), nil, "", time.Time{})
	if !s.Closing() {
		t.Fatal("gate open after the residency with a load intent queued")
	}
	late := waiter("A", 0, at(61*time.Second))
	mustArrive(t, s, late, false)
	s.Release(at(62*time.Second), KeepAlive{})
	checkDecision(t, "one lease open", s.Next(at(62*time.Second)), nil, "", time.Time{})
	s.Release(at(63*time.Second), KeepAlive{})
	checkDecision(t, "drained", s.Next(at(63*time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	if got := s.Ready("B", at(68*time.Second)); !sameWaiters(got, []*Waiter{load}) {
		t.Fatalf("Ready(B) = [%s], want the intent", profiles(got))
	}
	if s.InFlight() != 0 {
		t.Fatalf("in flight %d after an intent was admitted", s.InFlight())
	}
	// B has no demand: once the idle grace is over, the waiting A goes next.
	checkDecision(t, "B within idle grace", s.Next(at(68*time.Second)), nil, "", at(69*time.Second))
	checkDecision(t, "B idle", s.Next(at(69*time.Second)), nil, "A", time.Time{})
}

func TestIntentsDoneAtOnce(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Minute}, "A", t0)
	mustArrive(t, s, intent("A", 0, at(time.Second)), true)
	if s.InFlight() != 0 || s.QueueLen() != 0 {
		t.Fatalf("load of the loaded profile: in flight %d, queued %d", s.InFlight(), s.QueueLen())
	}
	var empty Scheduler
	mustArrive(t, &empty, intent("", 0, at(0)), true)
	if empty.InFlight() != 0 || empty.QueueLen() != 0 || empty.Swapping() {
		t.Fatal("unload of an empty pool left state behind")
	}
}

// An unload intent drains the pool like a swap and leaves it empty; the next
// request loads its profile again.
func TestUnloadIntent(t *testing.T) {
	pol := Policy{MinResidency: 10 * time.Second, IdleGrace: time.Second}
	s := loadedAt(pol, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	unload := intent("", 0, at(2*time.Second))
	mustArrive(t, s, unload, false)
	mustArrive(t, s, waiter("A", 0, at(5*time.Second)), true) // within the residency
	checkDecision(t, "resident", s.Next(at(5*time.Second)), nil, "", at(10*time.Second))
	s.Next(at(10 * time.Second))
	mustArrive(t, s, waiter("A", 0, at(11*time.Second)), false)
	s.Release(at(12*time.Second), KeepAlive{})
	s.Release(at(12*time.Second), KeepAlive{})
	d := s.Next(at(12 * time.Second))
	if !d.Unload || d.Load != "" || len(d.Admit) != 0 {
		t.Fatalf("drained: %+v, want Unload", d)
	}
	s.Begin("")
	if !s.Swapping() || s.Loaded() != "" || s.Target() != "" {
		t.Fatalf("unloading: swapping %v, loaded %q, target %q", s.Swapping(), s.Loaded(), s.Target())
	}
	mustArrive(t, s, waiter("A", 0, at(13*time.Second)), false)
	checkDecision(t, "unloading", s.Next(at(13*time.Second)), nil, "", time.Time{})
	if got := s.Ready("", at(14*time.Second)); !sameWaiters(got, []*Waiter{unload}) {
		t.Fatalf(`Ready("") = [%s], want the unload intent`, profiles(got))
	}
	checkDecision(t, "empty", s.Next(at(14*time.Second)), nil, "A", time.Time{})
}

// An unload waits behind older waiters like any request: in an empty pool a
// queued request is loaded and served first.
func TestUnloadOrderedBehindOlderWaiter(t *testing.T) {
	pol := Policy{MinResidency: 10 * time.Second, IdleGrace: time.Second}
	var s Scheduler
	s.Policy = pol
	b := waiter("B", 0, at(0))
	mustArrive(t, &s, b, false)
	unload := intent("", 0, at(time.Second))
	mustArrive(t, &s, unload, false)
	checkDecision(t, "empty", s.Next(at(time.Second)), nil, "B", time.Time{})
	s.Begin("B")
	if got := s.Ready("B", at(2*time.Second)); !sameWaiters(got, []*Waiter{b}) {
		t.Fatalf("Ready(B) = [%s]", profiles(got))
	}
	s.Release(at(3*time.Second), KeepAlive{})
	checkDecision(t, "B idle soon", s.Next(at(3*time.Second)), nil, "", at(4*time.Second))
	if d := s.Next(at(4 * time.Second)); !d.Unload {
		t.Fatalf("B idle: %+v, want Unload", d)
	}
}

// An intent that goes first is done at once and the decision goes on to the
// next profile in the same call.
func TestIntentAdmittedThenNextLoads(t *testing.T) {
	pol := Policy{MinResidency: 10 * time.Second, IdleGrace: time.Second, PriorityAge: time.Minute}
	s := loadedAt(pol, "A", t0)
	b := waiter("B", 0, at(20*time.Second))
	mustArrive(t, s, b, false)
	s.Next(at(20 * time.Second)) // idle: the gate closes
	again := intent("A", 1, at(21*time.Second))
	mustArrive(t, s, again, false)
	checkDecision(t, "intent first", s.Next(at(21*time.Second)), []*Waiter{again}, "B", time.Time{})
}

// Intents count towards maxQueue; Waiting counts a load under its profile and
// an unload not at all.
func TestIntentsQueueCounting(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Minute, MaxQueue: 2}, "A", t0)
	mustArrive(t, s, intent("", 0, at(time.Second)), false)
	mustArrive(t, s, intent("B", 0, at(2*time.Second)), false)
	if _, err := s.Arrive(waiter("C", 0, at(3*time.Second))); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third waiter: %v, want ErrQueueFull", err)
	}
	if m, oldest := s.Waiting(); len(m) != 1 || m["B"] != 1 || !oldest.Equal(at(2*time.Second)) {
		t.Fatalf("Waiting = %v, %v; want the load of B only", m, offset(oldest))
	}
	if !s.Queued("B") {
		t.Fatal("a load intent for B does not count as queued for B (placement)")
	}
}

// A withdrawn unload (its client left) reopens the gate without a swap.
func TestCancelledUnloadCausesNoSwap(t *testing.T) {
	s := loadedAt(Policy{MinResidency: time.Second, IdleGrace: time.Second}, "A", t0)
	mustArrive(t, s, waiter("A", 0, at(time.Second)), true)
	unload := intent("", 0, at(2*time.Second))
	mustArrive(t, s, unload, false)
	s.Next(at(2 * time.Second))
	a := waiter("A", 0, at(3*time.Second))
	mustArrive(t, s, a, false)
	if !s.Cancel(unload) {
		t.Fatal("Cancel(unload) = false")
	}
	checkDecision(t, "withdrawn", s.Next(at(3*time.Second)), []*Waiter{a}, "", time.Time{})
	if s.Closing() || s.InFlight() != 2 {
		t.Fatalf("closing %v, in flight %d", s.Closing(), s.InFlight())
	}
}

// A failed unload answers its intents and leaves the pool empty.
func TestFailedUnload(t *testing.T) {
	s := loadedAt(Policy{}, "A", t0)
	unload := intent("", 0, at(time.Second))
	mustArrive(t, s, unload, false)
	if d := s.Next(at(time.Second)); !d.Unload {
		t.Fatalf("%+v, want Unload", d)
	}
	s.Begin("")
	if got := s.Failed(""); !sameWaiters(got, []*Waiter{unload}) {
		t.Fatalf(`Failed("") = [%s]`, profiles(got))
	}
	if s.Swapping() || s.Loaded() != "" || s.QueueLen() != 0 {
		t.Fatal("state left after a failed unload")
	}
}
