package usage

import (
	"cmp"
	"context"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"time"

	"github.com/poold/poold/internal/activity"
)

// Split is how a serving interval's GPU time is shared among the tenants
// whose requests it served.
type Split string

const (
	// SplitTokens shares it by the tenants' tokens (prompt and completion)
	// among the requests of the interval.
	SplitTokens Split = "tokens"
	// SplitLease shares it by the tenants' lease time within the interval.
	SplitLease Split = "lease"
)

// ParseSplit reads a Split setting.
func ParseSplit(s string) (Split, error) {
	switch Split(s) {
	case SplitTokens, SplitLease:
		return Split(s), nil
	}
	return "", fmt.Errorf("split %q: must be tokens or lease", s)
}

// Uses: what a line of GPU time was. A tenant's line is UseServing; the
// others are a pool's activities, and UseUnattributed is serving time
// whose requests have no row (rows lost).
const (
	UseServing      = string(activity.Serving)
	UseUnattributed = "unattributed"
)

// useOrder orders a report's lines: tenants first, then the pools' own time.
var useOrder = []string{UseServing, string(activity.Idle), string(activity.Swapping), string(activity.Asleep), string(activity.Empty), UseUnattributed}

// Atom is the finest unit of attribution: one UTC day, pool, profile and
// tenant (for serving) or use, with its GPU time and the requests that
// ended in it.
type Atom struct {
	Day      string // 2006-01-02, UTC
	Pool     string // "host/pool" for rows from the fleet
	Profile  string
	Tenant   string // serving only
	Use      string
	GPUModel string
	Counts
}

// Counts are what atoms and report rows add up.
type Counts struct {
	Requests          int64 `json:"requests"`
	Failed            int64 `json:"failed"` // status 400 or more, or the answer cut off
	PromptTokens      int64 `json:"promptTokens"`
	CompletionTokens  int64 `json:"completionTokens"`
	EstimatedRequests int64 `json:"estimatedRequests"` // requests whose tokens are estimates
	// GPUMicros is GPU-microseconds: wall time times the GPUs held.
	GPUMicros int64 `json:"gpuMicroseconds"`
	// SharedMicros is the part of GPUMicros that is a pool's own time
	// spread over tenants (Usage.SpreadPoolTime); 0 without a spread.
	SharedMicros int64 `json:"sharedGpuMicroseconds,omitempty"`
}

func (c *Counts) add(o Counts) {
	c.Requests += o.Requests
	c.Failed += o.Failed
	c.PromptTokens += o.PromptTokens
	c.CompletionTokens += o.CompletionTokens
	c.EstimatedRequests += o.EstimatedRequests
	c.GPUMicros += o.GPUMicros
	c.SharedMicros += o.SharedMicros
}

// PoolTotal is one pool's check: the GPU time its intervals cover in the
// window (Covered is the wall time, GPUMicros that times its GPUs) against
// the sum of its lines, which must be equal.
type PoolTotal struct {
	Pool          string
	CoveredMicros int64
	GPUMicros     int64
	LinesMicros   int64
}

// AddsUp reports whether the pool's lines add up to its GPU time.
func (p PoolTotal) AddsUp() bool { return p.LinesMicros == p.GPUMicros }

// Usage is the attribution of a window's rows.
type Usage struct {
	Since, Until time.Time
	Split        Split
	Spread       Spread // how the pools' own time was spread; "": it was not
	// Tenant, when not empty, is the one tenant whose lines these are
	// (OfTenant); empty: every line.
	Tenant string
	Atoms  []Atom
	Pools  []PoolTotal
}

// OfTenant is u restricted to tenant's own lines, its serving time and its
// requests. It has no pool checks: one tenant's lines do not add up to a
// pool's GPU time, and the pools' own time and other tenants' are not the
// tenant's to see.
func (u *Usage) OfTenant(tenant string) *Usage {
	o := &Usage{Since: u.Since, Until: u.Until, Split: u.Split, Spread: u.Spread, Tenant: tenant}
	for _, a := range u.Atoms {
		if a.Use == UseServing && a.Tenant == tenant {
			o.Atoms = append(o.Atoms, a)
		}
	}
	return o
}

// poolKey names a row's pool: the pool, prefixed by its host in fleet rows.
func poolKey(host, name string) string {
	if host == "" {
		return name
	}
	return host + "/" + name
}

// Attribute shares the GPU time of the intervals within [since, until)
// among tenants and uses, and counts the requests that ended in it. Each
// serving interval's time goes to the tenants of the requests it served
// (each request belongs to the serving interval of its pool that its lease
// overlaps most), by split; when their tokens are all zero, by lease time;
// an interval with no request row is UseUnattributed. The other intervals
// are lines of their own. Time is split at UTC midnights, and shares are
// whole GPU-microseconds (largest remainder), so that every pool's lines
// add up to its GPU time exactly. reqs must include the requests that
// overlap the intervals, not only the window, for the shares of intervals
// that straddle its edges.
func Attribute(ivs []Interval, reqs []Request, since, until time.Time, split Split) *Usage {
	u := &Usage{Since: since, Until: until, Split: split}
	atoms := make(map[Atom]*Atom) // keyed by the atom with zero Counts
	add := func(key Atom) *Atom {
		a := atoms[key]
		if a == nil {
			a = &key
			atoms[key] = a
		}
		return a
	}

	serving := make(map[string][]*Interval) // by pool key, by start
	for i := range ivs {
		if iv := &ivs[i]; iv.Activity == activity.Serving {
			k := poolKey(iv.Host, iv.Pool)
			serving[k] = append(serving[k], iv)
		}
	}
	for _, list := range serving {
		slices.SortFunc(list, func(a, b *Interval) int { return a.Start.Compare(b.Start) })
	}
	served := make(map[*Interval][]*Request)
	for i := range reqs {
		r := &reqs[i]
		if r.Pool == "" {
			continue
		}
		if iv := servingOf(serving[poolKey(r.Host, r.Pool)], r); iv != nil {
			served[iv] = append(served[iv], r)
		}
	}

	totals := make(map[string]*PoolTotal)
	for i := range ivs {
		iv := &ivs[i]
		k := poolKey(iv.Host, iv.Pool)
		t := totals[k]
		if t == nil {
			t = &PoolTotal{Pool: k}
			totals[k] = t
		}
		var tenants []string
		var weights []int64
		if iv.Activity == activity.Serving {
			tenants, weights = shares(iv, served[iv], split)
		}
		for _, piece := range days(iv.Start, iv.End, since, until) {
			us := piece.end.Sub(piece.start).Microseconds()
			gpu := us * iv.gpuCount()
			t.CoveredMicros += us
			t.GPUMicros += gpu
			base := Atom{Day: piece.day, Pool: k, Profile: iv.Profile, GPUModel: iv.GPUModel, Use: string(iv.Activity)}
			if iv.Activity != activity.Serving {
				add(base).GPUMicros += gpu
				continue
			}
			if len(tenants) == 0 {
				base.Use = UseUnattributed
				add(base).GPUMicros += gpu
				continue
			}
			for j, part := range splitMicros(gpu, weights) {
				base.Tenant = tenants[j]
				add(base).GPUMicros += part
			}
		}
	}

	for i := range reqs {
		r := &reqs[i]
		if r.Ended.Before(since) || !r.Ended.Before(until) {
			continue
		}
		a := add(Atom{Day: r.Ended.UTC().Format(time.DateOnly), Pool: poolKey(r.Host, r.Pool), Profile: r.Profile, Tenant: r.Tenant, Use: UseServing})
		a.Requests++
		if r.Failed() {
			a.Failed++
		}
		a.PromptTokens += r.PromptTokens
		a.CompletionTokens += r.CompletionTokens
		if r.TokensEstimated {
			a.EstimatedRequests++
		}
	}
	// A request row knows no GPU model; its pool's intervals do. Merging
	// the request counts into the atom that carries the model keeps one
	// line per tenant.
	for _, a := range atoms {
		u.Atoms = append(u.Atoms, *a)
	}
	u.Atoms = mergeModels(u.Atoms)
	for _, a := range u.Atoms {
		if t := totals[a.Pool]; t != nil {
			t.LinesMicros += a.GPUMicros
		}
	}
	for _, t := range totals {
		u.Pools = append(u.Pools, *t)
	}
	slices.SortFunc(u.Pools, func(a, b PoolTotal) int { return cmp.Compare(a.Pool, b.Pool) })
	return u
}

// mergeModels folds the request counts of atoms without a GPU model into the
// atom of the same day, pool, profile, tenant and use that has one, and
// sorts the atoms.
func mergeModels(atoms []Atom) []Atom {
	slices.SortFunc(atoms, func(a, b Atom) int {
		return cmp.Or(cmp.Compare(a.Day, b.Day), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Profile, b.Profile),
			cmp.Compare(slices.Index(useOrder, a.Use), slices.Index(useOrder, b.Use)), cmp.Compare(a.Tenant, b.Tenant),
			cmp.Compare(b.GPUModel, a.GPUModel)) // the model first, "" last
	})
	out := atoms[:0]
	for _, a := range atoms {
		if n := len(out); n > 0 && a.GPUModel == "" {
			p := &out[n-1]
			if p.Day == a.Day && p.Pool == a.Pool && p.Profile == a.Profile && p.Tenant == a.Tenant && p.Use == a.Use {
				p.add(a.Counts)
				continue
			}
		}
		out = append(out, a)
	}
	return out
}

// servingOf is the serving interval of list (one pool's, by start) whose
// span overlaps r's lease most, or nil.
func servingOf(list []*Interval, r *Request) *Interval {
	from, to := r.leaseStart(), r.Ended
	var best *Interval
	var bestOverlap time.Duration
	for j := sort.Search(len(list), func(i int) bool { return list[i].Start.After(to) }) - 1; j >= 0 && !list[j].End.Before(from); j-- {
		iv := list[j]
		o := minTime(iv.End, to).Sub(maxTime(iv.Start, from))
		if best == nil || o > bestOverlap {
			best, bestOverlap = iv, o
		}
	}
	return best
}

// shares are the tenants served by a serving interval and their weights,
// by split; tokens that are all zero fall back to lease time, and lease
// times that are all zero to one share per request.
func shares(iv *Interval, rs []*Request, split Split) ([]string, []int64) {
	w := make(map[string]int64)
	var sum int64
	if split == SplitTokens {
		for _, r := range rs {
			n := r.PromptTokens + r.CompletionTokens
			w[r.Tenant] += n
			sum += n
		}
	}
	if sum == 0 {
		clear(w)
		for _, r := range rs {
			n := max(minTime(iv.End, r.Ended).Sub(maxTime(iv.Start, r.leaseStart())).Microseconds(), 0)
			w[r.Tenant] += n
			sum += n
		}
	}
	if sum == 0 {
		clear(w)
		for _, r := range rs {
			w[r.Tenant]++
		}
	}
	tenants := make([]string, 0, len(w))
	for t := range w {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	weights := make([]int64, len(tenants))
	for i, t := range tenants {
		weights[i] = w[t]
	}
	return tenants, weights
}

// splitMicros divides total among weights in proportion, in whole units
// that add up to total: each gets the floor of its share, and what is left
// goes one unit each to the largest remainders (the earliest on a tie).
// Weights are non-negative with a positive sum.
func splitMicros(total int64, weights []int64) []int64 {
	var sum uint64
	for _, w := range weights {
		sum += uint64(w)
	}
	parts := make([]int64, len(weights))
	rems := make([]uint64, len(weights))
	left := total
	for i, w := range weights {
		hi, lo := bits.Mul64(uint64(total), uint64(w))
		q, r := bits.Div64(hi, lo, sum) // w <= sum, so q <= total fits
		parts[i], rems[i] = int64(q), r
		left -= int64(q)
	}
	order := make([]int, len(weights))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rems[b], rems[a]) })
	for _, i := range order[:left] {
		parts[i]++
	}
	return parts
}

// piece is the part of an interval within one UTC day.
type piece struct {
	day        string
	start, end time.Time
}

// days clips [start, end) to [since, until) and cuts it at UTC midnights.
func days(start, end, since, until time.Time) []piece {
	start, end = maxTime(start, since), minTime(end, until)
	var out []piece
	for start.Before(end) {
		d := start.UTC()
		midnight := time.Date(d.Year(), d.Month(), d.Day()+1, 0, 0, 0, 0, time.UTC)
		stop := minTime(end, midnight)
		out = append(out, piece{day: d.Format(time.DateOnly), start: start, end: stop})
		start = stop
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Collect reads the rows a window's report needs from src and attributes
// them: the intervals that overlap the window, and the requests that
// overlap those intervals or the window.
func Collect(ctx context.Context, src Source, since, until time.Time, split Split) (*Usage, error) {
	ivs, err := src.Intervals(ctx, since, until)
	if err != nil {
		return nil, fmt.Errorf("reading pool intervals: %w", err)
	}
	from, to := since, until
	for _, iv := range ivs {
		from, to = minTime(from, iv.Start), maxTime(to, iv.End)
	}
	reqs, err := src.Requests(ctx, from, to)
	if err != nil {
		return nil, fmt.Errorf("reading requests: %w", err)
	}
	return Attribute(ivs, reqs, since, until, split), nil
}
