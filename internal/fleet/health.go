package fleet

import (
	"time"
)

// Passive health: what fleetd's own forwards say of each model on each host.
const (
	// healthWindow is how long an answer counts in a success ratio; it is
	// kept as two halves, the older dropped as a whole.
	healthWindow = 30 * time.Second
	// minAnswers is how many answers in the window a ratio needs to mean
	// anything.
	minAnswers = 5
	// minSuccess is the success ratio below which a model on a host is
	// Degraded.
	minSuccess = 0.8
)

// outcome is what one forward says of a model on a host.
type outcome int

const (
	// neutral says nothing of the host: the client left, a key was refused,
	// or a full queue shed load.
	neutral outcome = iota
	success
	// failure: a 5xx answer, or a stream cut before its end.
	failure
)

// ejection is the ejected-until state of a host, or of a model on a host.
// An ejection lasts at least base (the poll interval, unless the maximum is
// lower); one that comes
// within twice the last one's length of the re-admission doubles it, up to
// a maximum, so that a flapping host stays out longer. The zero value is
// not ejected.
type ejection struct {
	until      time.Time // zero: not ejected
	length     time.Duration
	readmitted time.Time
	cause      string
}

// eject starts an ejection at now; again (a failed trial) doubles it at once.
func (e *ejection) eject(now time.Time, base, maxLen time.Duration, cause string, again bool) {
	l := min(base, maxLen)
	if e.length > 0 && (again || now.Sub(e.readmitted) < 2*e.length) {
		l = min(max(2*e.length, base), maxLen)
	}
	e.length, e.until, e.cause = l, now.Add(l), cause
}

func (e *ejection) active() bool { return !e.until.IsZero() }

// over reports whether an active ejection has lasted its length.
func (e *ejection) over(now time.Time) bool { return e.active() && !now.Before(e.until) }

func (e *ejection) readmit(now time.Time) {
	e.until, e.cause, e.readmitted = time.Time{}, "", now
}

// modelHealth is the passive health of one model on one host.
type modelHealth struct {
	// halves counts answers in the current and the previous half window.
	halves    [2]struct{ ok, failed int }
	halfStart time.Time // of halves[0]
	fails     int       // failures in a row
	eject     ejection
	// trialBusy is set while the trial request after an ejection is in
	// flight: no other request goes there meanwhile.
	trialBusy bool
}

// rotate moves the window on to now.
func (m *modelHealth) rotate(now time.Time) {
	half := healthWindow / 2
	switch d := now.Sub(m.halfStart); {
	case d >= healthWindow:
		m.halves = [2]struct{ ok, failed int }{}
		m.halfStart = now
	case d >= half:
		m.halves[1], m.halves[0] = m.halves[0], struct{ ok, failed int }{}
		m.halfStart = m.halfStart.Add(half)
	}
}

// ratio is the success ratio over the window and how many answers it counts.
func (m *modelHealth) ratio(now time.Time) (float64, int) {
	m.rotate(now)
	ok, n := 0, 0
	for _, h := range m.halves {
		ok += h.ok
		n += h.ok + h.failed
	}
	if n == 0 {
		return 1, 0
	}
	return float64(ok) / float64(n), n
}

// health is the model's class now, or false when it is ejected (or its
// trial is in flight).
func (m *modelHealth) health(now time.Time) (Health, bool) {
	switch {
	case m.eject.active() && (!m.eject.over(now) || m.trialBusy):
		return 0, false
	case m.eject.active():
		return Trial, true
	}
	if r, n := m.ratio(now); n >= minAnswers && r < minSuccess {
		return Degraded, true
	}
	return Healthy, true
}

// record folds one forward's outcome in and reports whether it ejected the
// model. trial says the forward was the trial after an ejection.
func (m *modelHealth) record(o outcome, trial bool, now time.Time, ejectAfter int, base, maxLen time.Duration) bool {
	if trial {
		m.trialBusy = false
	}
	m.rotate(now)
	switch o {
	case success:
		m.halves[0].ok++
		m.fails = 0
		if trial {
			// The path that failed works again: forget the failures that
			// ejected it, or the ratio would keep it degraded.
			m.eject.readmit(now)
			m.halves = [2]struct{ ok, failed int }{{ok: 1}}
		}
	case failure:
		m.halves[0].failed++
		m.fails++
		if trial || (!m.eject.active() && m.fails >= ejectAfter) {
			m.eject.eject(now, base, maxLen, "errors", trial)
			return true
		}
	}
	return false
}
