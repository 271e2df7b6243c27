package usage

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/poold/poold/internal/activity"
)

// Spread is how a report shares the pools' own time (idle, swapping,
// asleep, empty) among tenants, so that each tenant's line says what it
// owes with the capacity it kept waiting included. The zero value spreads
// nothing: that time stays on lines of its own.
type Spread string

const (
	// SpreadNone keeps the pools' own time on lines of its own.
	SpreadNone Spread = ""
	// SpreadTokens shares each pool's own time among the tenants it
	// served in the window, by their tokens there (prompt and completion;
	// by their serving GPU time when they have no tokens).
	SpreadTokens Spread = "tokens"
	// SpreadHolder gives each stretch of a pool's own time to the tenants
	// of the model that held the pool then (idle: the model loaded;
	// swapping: the one being loaded; asleep: those asleep), by their
	// tokens on it in the window, and shares it as SpreadTokens does where
	// nobody used that model, or no model held the pool (empty).
	SpreadHolder Spread = "holder"
)

// ParseSpread reads a --spread value: none (or ""), tokens or holder.
func ParseSpread(s string) (Spread, error) {
	switch s {
	case "", "none":
		return SpreadNone, nil
	case string(SpreadTokens), string(SpreadHolder):
		return Spread(s), nil
	}
	return "", fmt.Errorf("spread %q: must be none, tokens or holder", s)
}

// spreadUses are the pools' own uses a spread shares out; unattributed
// time (request rows lost) is not a tenant's to pay.
var spreadUses = []string{string(activity.Idle), string(activity.Swapping), string(activity.Asleep), string(activity.Empty)}

// SpreadPoolTime shares u's lines of the pools' own time among tenants by
// how: each such line becomes serving lines of the tenants it goes to (on
// its day, pool, model and GPU model), counted in SharedMicros as well as
// GPUMicros, in whole GPU-microseconds that add up to the line's. A pool
// that served no tenant in the window keeps its own lines. Every pool's
// lines still add up to its GPU time.
func (u *Usage) SpreadPoolTime(how Spread) {
	if how == SpreadNone {
		return
	}
	u.Spread = how
	// Each tenant's weight per pool, and per pool and model.
	type key struct{ pool, profile string }
	byPool := map[string]map[string]int64{}
	byModel := map[key]map[string]int64{}
	gpuByPool := map[string]map[string]int64{}
	for _, a := range u.Atoms {
		if a.Use != UseServing || a.Tenant == "" {
			continue
		}
		tokens := a.PromptTokens + a.CompletionTokens
		addWeight(byPool, a.Pool, a.Tenant, tokens)
		addWeight(byModel, key{a.Pool, a.Profile}, a.Tenant, tokens)
		addWeight(gpuByPool, a.Pool, a.Tenant, a.GPUMicros)
	}
	var out []Atom
	for _, a := range u.Atoms {
		if !slices.Contains(spreadUses, a.Use) || a.GPUMicros == 0 {
			out = append(out, a)
			continue
		}
		w := byPool[a.Pool]
		if how == SpreadHolder && a.Profile != "" {
			// Asleep, the profile lists every model asleep on the pool.
			held := map[string]int64{}
			for _, m := range strings.Split(a.Profile, ",") {
				for t, n := range byModel[key{a.Pool, m}] {
					held[t] += n
				}
			}
			if positive(held) {
				w = held
			}
		}
		if !positive(w) {
			w = gpuByPool[a.Pool]
		}
		if !positive(w) {
			out = append(out, a) // nobody to share it with
			continue
		}
		tenants := slices.Sorted(maps.Keys(w))
		weights := make([]int64, len(tenants))
		for i, t := range tenants {
			weights[i] = w[t]
		}
		for i, part := range splitMicros(a.GPUMicros, weights) {
			if part == 0 {
				continue
			}
			out = append(out, Atom{Day: a.Day, Pool: a.Pool, Profile: a.Profile, Tenant: tenants[i], Use: UseServing, GPUModel: a.GPUModel,
				Counts: Counts{GPUMicros: part, SharedMicros: part}})
		}
	}
	u.Atoms = out
}

// addWeight adds n to tenant's weight under k.
func addWeight[K comparable](m map[K]map[string]int64, k K, tenant string, n int64) {
	if m[k] == nil {
		m[k] = map[string]int64{}
	}
	m[k][tenant] += n
}

// positive reports whether the weights have a positive sum.
func positive(w map[string]int64) bool {
	var sum int64
	for _, n := range w {
		sum += n
	}
	return sum > 0
}
