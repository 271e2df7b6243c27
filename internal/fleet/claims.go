package fleet

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
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
