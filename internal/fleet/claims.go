package fleet

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/poold/poold/internal/placement"
)

// Claims decide which host loads a new copy of a model when several
// requests, or several fleetd replicas, want one at once: the first claim
// of a key wins until its lease ends, and every later claim learns the
// winner and follows it. rdb.Client implements it on a Redis shared by the
// replicas; without one, each fleetd claims only against itself.
type Claims interface {
	// Claim records host for key unless a claim of key is in force, and
	// returns the host of the claim in force (host when this one won).
	Claim(ctx context.Context, key, host string, lease time.Duration) (string, error)
}

// localClaims are this fleetd's claims in force, which also cache those of
// the shared store. The zero value is empty and ready.
type localClaims struct {
	mu     sync.Mutex // guards claims
	claims map[string]localClaim
}

type localClaim struct {
	host  string
	until time.Time
}

// claim records host for key until now+lease unless a claim is in force,
// and returns the host of the claim in force and whether it was there
// before.
func (c *localClaims) claim(key, host string, now time.Time, lease time.Duration) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.claims[key]; ok && now.Before(cl.until) {
		return cl.host, true
	}
	if c.claims == nil {
		c.claims = make(map[string]localClaim)
	}
	for k, cl := range c.claims { // few keys: one per model being loaded
		if !now.Before(cl.until) {
			delete(c.claims, k)
		}
	}
	c.claims[key] = localClaim{host, now.Add(lease)}
	return host, false
}

// put records host for key until until, whatever was there.
func (c *localClaims) put(key, host string, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.claims == nil {
		c.claims = make(map[string]localClaim)
	}
	c.claims[key] = localClaim{host, until}
}

// held returns the host of key's claim in force, or "".
func (c *localClaims) held(key string, now time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.claims[key]; ok && now.Before(cl.until) {
		return cl.host
	}
	return ""
}

// jitter returns a factor in [1, 2), drawn once per fleetd: each replica's
// scale-out cool-down differs, so that replicas without a shared store do
// not keep scaling the same model out in step.
func jitter() float64 { return 1 + rand.Float64() }

// claimCopy decides where a new copy of the model goes when the best host
// in order would start one (its rank is asleep, empty, idle or queue, or
// it is a scale-out): the first claim of the model's copy wins for the
// claim lease, in this fleetd and, with Claims, across replicas, and the
// requests that claim it later go to the winner, so that a cold burst
// loads one copy. It returns the order to try.
func (h *Handler) claimCopy(ctx context.Context, order []Choice, views []HostView) []Choice {
	c := order[0]
	if c.Rank <= placement.Loading && c.Reason != ReasonScaleOut {
		return order
	}
	root := rootOf(views, c.Host)
	key := "copy:" + root
	if h.opts.Claims != nil {
		h.claiming.Lock()
		defer h.claiming.Unlock()
	}
	now := h.fleet.opts.Now()
	winner, had := h.claims.claim(key, c.Host, now, h.opts.ClaimLease)
	if !had && h.opts.Claims != nil {
		cctx, cancel := context.WithTimeout(ctx, h.opts.ClaimTimeout)
		shared, err := h.opts.Claims.Claim(cctx, key, c.Host, h.opts.ClaimLease)
		cancel()
		switch {
		case err != nil:
			h.fleet.metrics.claim("error")
			h.log.Warn("shared claim failed; claiming for this fleetd only", "model", root, "err", err)
		case shared != c.Host:
			winner = shared
			h.claims.put(key, shared, now.Add(h.opts.ClaimLease))
		}
	}
	switch {
	case winner == c.Host && !had:
		h.fleet.metrics.claim("won")
		if c.Reason == ReasonScaleOut {
			h.scaledOut.put(root, c.Host, now.Add(h.cooldown))
			h.fleet.scale.add(root, c.Host, now)
			h.fleet.metrics.scale("out", "claimed")
			h.log.Info("scale-out: every awake copy is saturated; loading another", "model", root, "host", c.Host)
		}
		return order
	case winner == c.Host:
		return order
	}
	i := slices.IndexFunc(order, func(o Choice) bool { return o.Host == winner })
	if i < 0 {
		h.fleet.metrics.claim("lost-unroutable")
		return order // the winner is ejected or gone, as seen from here
	}
	h.fleet.metrics.claim("followed")
	w := order[i]
	w.Rank, w.Reason = placement.Loading, placement.Loading.String()
	out := make([]Choice, 0, len(order))
	out = append(out, w)
	out = append(out, order[:i]...)
	return append(out, order[i+1:]...)
}
