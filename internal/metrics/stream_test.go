package metrics

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/statusapi"
)

func TestP2MedianExactForFewValues(t *testing.T) {
	for _, tt := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{9, 1}, 5},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{5, 4, 1, 3, 2}, 3},
	} {
		var e p2Median
		for _, x := range tt.in {
			e.add(x)
		}
		if got := e.value(); got != tt.want {
			t.Errorf("median of %v = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// The estimate stays close to the true median for shapes that inter-token
// gaps take: flat, skewed, with rare long stalls, and sorted either way.
func TestP2MedianEstimates(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := map[string]func(i int) float64{
		"uniform":     func(int) float64 { return rng.Float64() },
		"exponential": func(int) float64 { return rng.ExpFloat64() },
		"jittered 50ms with stalls": func(int) float64 {
			if rng.IntN(50) == 0 {
				return 2 + rng.Float64()
			}
			return .05 + .005*rng.NormFloat64()
		},
		"ascending":  func(i int) float64 { return float64(i) },
		"descending": func(i int) float64 { return float64(-i) },
	}
	for name, next := range shapes {
		var e p2Median
		xs := make([]float64, 2001)
		for i := range xs {
			xs[i] = next(i)
			e.add(xs[i])
		}
		slices.Sort(xs)
		want, spread := xs[len(xs)/2], xs[len(xs)*3/4]-xs[len(xs)/4]
		if got := e.value(); math.Abs(got-want) > 0.05*spread {
			t.Errorf("%s: median estimate %v, true %v (interquartile range %v)", name, got, want, spread)
		}
	}
}

func TestStreamTiming(t *testing.T) {
	itl := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "itl", Help: "h", Buckets: itlBuckets})
	t0 := time.Unix(1700000000, 0)
	var st StreamTiming
	st.Begin(t0, itl)
	st.Content(t0.Add(100*time.Millisecond), 0) // a role-only chunk: no content
	st.Content(t0.Add(200*time.Millisecond), 1)
	at := t0.Add(200 * time.Millisecond)
	for _, gap := range []time.Duration{50, 40, 60, 50, 300} {
		at = at.Add(gap * time.Millisecond)
		st.Content(at, 1)
	}
	at = at.Add(50 * time.Millisecond)
	st.Content(at, 3) // three chunks read at once: gaps 50 ms, 0, 0

	var r record.Request
	st.Record(&r)
	if r.TTFT != 200*time.Millisecond || r.ITLGaps != 8 || r.ITLMax != 300*time.Millisecond || r.ITLP50 != 50*time.Millisecond {
		t.Errorf("record: TTFT %v, %d gaps, p50 %v, max %v; want 200ms, 8, 50ms, 300ms", r.TTFT, r.ITLGaps, r.ITLP50, r.ITLMax)
	}
	if n := testutil.CollectAndCount(itl); n != 1 {
		t.Fatalf("%d histograms", n)
	}
	if got := histogramCount(t, itl); got != 8 {
		t.Errorf("gaps observed: %d, want 8", got)
	}

	// A stream without content: no TTFT, no gap.
	st.Begin(t0, nil)
	st.Content(t0.Add(time.Second), 0)
	r = record.Request{}
	st.Record(&r)
	if r.TTFT != 0 || r.ITLGaps != 0 {
		t.Errorf("no content: TTFT %v, %d gaps; want none", r.TTFT, r.ITLGaps)
	}
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs[0].GetMetric()[0].GetHistogram().GetSampleCount()
}

// Observe puts a stream's TTFT in its histogram, labelled by pool, profile
// and client; ITL observes each gap; neither sees a plain answer.
func TestTTFTAndITLHistograms(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, func() []statusapi.Pool { return nil }, "v", "r")
	var st StreamTiming
	t0 := time.Now()
	st.Begin(t0, m.ITL("gpu0", "qwen", "team-a"))
	st.Content(t0.Add(250*time.Millisecond), 1)
	st.Content(t0.Add(300*time.Millisecond), 1)
	rec := &record.Request{Pool: "gpu0", Profile: "qwen", Client: "team-a", Status: 200, Stream: true}
	st.Record(rec)
	m.Observe(rec)
	m.Observe(&record.Request{Pool: "gpu0", Profile: "qwen", Client: "team-a", Status: 200})
	want := `
# HELP poold_time_to_first_token_seconds Time from a stream's arrival to the first chunk of generated text sent to the client, queueing included.
# TYPE poold_time_to_first_token_seconds histogram
`
	for _, le := range ttftBuckets {
		n := 0
		if le >= .25 {
			n = 1
		}
		want += `poold_time_to_first_token_seconds_bucket{client="team-a",pool="gpu0",profile="qwen",le="` + formatFloat(le) + `"} ` + formatFloat(float64(n)) + "\n"
	}
	want += `poold_time_to_first_token_seconds_bucket{client="team-a",pool="gpu0",profile="qwen",le="+Inf"} 1
poold_time_to_first_token_seconds_sum{client="team-a",pool="gpu0",profile="qwen"} 0.25
poold_time_to_first_token_seconds_count{client="team-a",pool="gpu0",profile="qwen"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "poold_time_to_first_token_seconds"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "poold_inter_token_latency_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 1 || math.Abs(h.GetSampleSum()-0.05) > 1e-9 {
				t.Errorf("ITL: %d gaps summing %vs; want one of 0.05s", h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// BenchmarkStreamTiming is the cost per content chunk of a stream's timing,
// the gap's histogram included.
func BenchmarkStreamTiming(b *testing.B) {
	_, m := newLoaded(b, twoGPUs)
	var st StreamTiming
	t0 := time.Now()
	st.Begin(t0, m.ITL("gpu0", "qwen", "team-a"))
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(20 * time.Millisecond)
		st.Content(now, 1)
	}
}
