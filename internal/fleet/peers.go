package fleet

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// DefaultShareEvery is how often a replica publishes its tenants' limits
// to the shared store and compares them with the other replicas'.
const DefaultShareEvery = 5 * time.Second

// PeerLimits is a store shared by the replicas where each publishes its
// tenants' limits and reads the others' (rdb.Client.ShareLimits): replicas
// whose tenants files differ keep a bucket each for a tenant they disagree
// on (rdb.LimitKey), so a tenant may get more than either file says, and
// this is how it shows.
type PeerLimits interface {
	// ShareLimits publishes limits (tenant → its limits, equal strings for
	// equal limits) as replica's for ttl, and returns the other replicas'
	// that have not expired, by replica.
	ShareLimits(ctx context.Context, replica string, limits map[string]string, ttl time.Duration) (map[string]map[string]string, error)
}

// limitsOf is what a replica publishes of c: each tenant's limits.
func limitsOf(c *tenant.Config) map[string]string {
	out := make(map[string]string, len(c.Tenants))
	for _, t := range c.Tenants {
		out[t.Name] = fmt.Sprintf("rpm=%d tpm=%d", t.RPM, t.TPM)
	}
	return out
}

// disagreements lists the tenants of ours to whom a peer gives other
// limits, sorted by tenant and replica; a tenant that a peer lacks is not
// one (that replica refuses its keys).
func disagreements(ours map[string]string, peers map[string]map[string]string) []statusapi.LimitsDisagreement {
	var out []statusapi.LimitsDisagreement
	for replica, theirs := range peers {
		for name, limits := range theirs {
			if mine, ok := ours[name]; ok && mine != limits {
				out = append(out, statusapi.LimitsDisagreement{Tenant: name, Replica: replica, Limits: limits, Ours: mine})
			}
		}
	}
	slices.SortFunc(out, func(a, b statusapi.LimitsDisagreement) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Replica, b.Replica))
	})
	return out
}

// ShareLimits publishes the limits in force as replica's to peers every
// interval (zero: DefaultShareEvery), each round bounded by timeout (zero:
// the interval), until ctx ends, and compares them with the other
// replicas': each disagreement is logged once, and those of the last round
// are shown in Status. A round that cannot reach the store keeps the last
// round's.
func (ts *Tenants) ShareLimits(ctx context.Context, peers PeerLimits, replica string, every, timeout time.Duration) {
	if every <= 0 {
		every = DefaultShareEvery
	}
	if timeout <= 0 {
		timeout = every
	}
	warned := make(map[statusapi.LimitsDisagreement]bool) // those logged
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ours := limitsOf(ts.gate.Config())
		rctx, cancel := context.WithTimeout(ctx, timeout)
		theirs, err := peers.ShareLimits(rctx, replica, ours, 3*every)
		cancel()
		if err == nil {
			found := disagreements(ours, theirs)
			for _, d := range found {
				if !warned[d] {
					ts.log.Warn("tenant limits differ between replicas: each counts them in buckets of its own; give every replica the same tenants file",
						"tenant", d.Tenant, "replica", d.Replica, "theirs", d.Limits, "ours", d.Ours)
				}
			}
			maps.DeleteFunc(warned, func(d statusapi.LimitsDisagreement, _ bool) bool { return !slices.Contains(found, d) })
			for _, d := range found {
				warned[d] = true
			}
			ts.mu.Lock()
			ts.disagree = found
			ts.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
