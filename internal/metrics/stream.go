package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/record"
)

// Buckets of what a stream's client feels. Time to first token counts from
// the request's arrival, so a swap's wait is in it: the buckets reach a
// cold load's, and hold 0.8 s, the usual objective.
var (
	ttftBuckets = []float64{.025, .05, .1, .2, .3, .4, .5, .6, .8, 1, 1.5, 2, 3, 5, 10, 30, 60, 120, 300, 600, 1800}
	itlBuckets  = []float64{.001, .0025, .005, .01, .015, .02, .025, .03, .04, .05, .06, .075, .1, .15, .2, .3, .5, 1, 2.5, 5, 10, 30}
)

// StreamTiming measures what one stream's client feels: the time from the
// request's arrival to the first chunk of generated text (time to first
// token), and the gaps between such chunks (inter-token latency), each gap
// observed in a histogram as it happens, and their median and maximum kept
// in constant memory for the access log. Chunks that reach the client
// together count gaps of zero after the first. The zero value measures
// from the zero time and observes no histogram: call Begin. It is not safe
// for concurrent use (one goroutine reads a stream).
type StreamTiming struct {
	start, last time.Time
	itl         prometheus.Observer // each gap, when not nil
	ttft, max   time.Duration
	gaps        int
	median      p2Median
}

// Begin starts measuring a stream that arrived at start; itl, if not nil,
// observes each gap in seconds (Metrics.ITL).
func (t *StreamTiming) Begin(start time.Time, itl prometheus.Observer) {
	*t = StreamTiming{start: start, itl: itl}
}

// Content records n chunks of generated text passed to the client at now.
func (t *StreamTiming) Content(now time.Time, n int) {
	if n <= 0 {
		return
	}
	if t.last.IsZero() {
		t.ttft = max(now.Sub(t.start), time.Nanosecond)
	} else {
		t.gap(now.Sub(t.last))
	}
	t.last = now
	for range n - 1 {
		t.gap(0)
	}
}

func (t *StreamTiming) gap(d time.Duration) {
	t.gaps++
	t.max = max(t.max, d)
	t.median.add(d.Seconds())
	if t.itl != nil {
		t.itl.Observe(d.Seconds())
	}
}

// Record copies the measures into r (TTFT, ITLGaps, ITLP50, ITLMax).
func (t *StreamTiming) Record(r *record.Request) {
	r.TTFT, r.ITLGaps, r.ITLMax = t.ttft, t.gaps, t.max
	r.ITLP50 = time.Duration(t.median.value() * float64(time.Second))
}

// ITL returns the observer of the inter-token latency of pool's profile's
// streams for client, for StreamTiming.Begin.
func (m *Metrics) ITL(pool, profile, client string) prometheus.Observer {
	return m.itl.WithLabelValues(pool, profile, client)
}

// p2Median estimates the median of a sequence in constant memory, with
// Jain and Chlamtac's P² algorithm: five markers track the minimum, the
// maximum, the median and the quartiles between, each middle one moved
// towards its ideal position along a parabola through its neighbours. The
// first five values are kept exactly. The zero value is empty.
type p2Median struct {
	n   int        // values seen
	q   [5]float64 // marker heights (sorted; the values themselves while n < 5)
	pos [5]int     // marker positions, 1-based
}

// p2Quantiles are the quantiles the markers aim at.
var p2Quantiles = [5]float64{0, .25, .5, .75, 1}

func (e *p2Median) add(x float64) {
	q, pos := &e.q, &e.pos
	if e.n < 5 {
		i := e.n
		for ; i > 0 && q[i-1] > x; i-- {
			q[i] = q[i-1]
		}
		q[i] = x
		e.n++
		if e.n == 5 {
			*pos = [5]int{1, 2, 3, 4, 5}
		}
		return
	}
	e.n++
	k := 0
	switch {
	case x < q[0]:
		q[0] = x
	case x >= q[4]:
		q[4] = x
		k = 3
	default:
		for x >= q[k+1] {
			k++
		}
	}
	for i := k + 1; i < 5; i++ {
		pos[i]++
	}
	for i := 1; i <= 3; i++ {
		d := 1 + float64(e.n-1)*p2Quantiles[i] - float64(pos[i])
		if !(d >= 1 && pos[i+1]-pos[i] > 1) && !(d <= -1 && pos[i-1]-pos[i] < -1) {
			continue
		}
		s := 1
		if d < 0 {
			s = -1
		}
		if h := e.parabolic(i, s); q[i-1] < h && h < q[i+1] {
			q[i] = h
		} else {
			q[i] += float64(s) * (q[i+s] - q[i]) / float64(pos[i+s]-pos[i])
		}
		pos[i] += s
	}
}

// parabolic is marker i's height moved by s (±1) along the parabola
// through it and its neighbours.
func (e *p2Median) parabolic(i, s int) float64 {
	q, n := &e.q, &e.pos
	fs := float64(s)
	return q[i] + fs/float64(n[i+1]-n[i-1])*
		(float64(n[i]-n[i-1]+s)*(q[i+1]-q[i])/float64(n[i+1]-n[i])+
			float64(n[i+1]-n[i]-s)*(q[i]-q[i-1])/float64(n[i]-n[i-1]))
}

// value is the estimate: exact for up to five values, 0 for none.
func (e *p2Median) value() float64 {
	switch {
	case e.n == 0:
		return 0
	case e.n >= 5:
		return e.q[2]
	case e.n%2 == 1:
		return e.q[e.n/2]
	}
	return (e.q[e.n/2-1] + e.q[e.n/2]) / 2
}
