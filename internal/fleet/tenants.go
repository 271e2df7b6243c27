package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// TenantsOptions configures LoadTenants. Zero values: Limiter → in-memory
// buckets, this fleetd's own; Logger → discard; Metrics → none; Now →
// time.Now.
type TenantsOptions struct {
	// Limiter keeps the tenants' rate limits; with Redis (rdb.Limits) they
	// hold across the replicas. Shared says it is such a store, FailClosed
	// that it refuses what it cannot check: both are shown in /status and
	// in the warning of an outage.
	Limiter            tenant.Limiter
	Shared, FailClosed bool
	Logger             *slog.Logger
	Metrics            *Metrics
	Now                func() time.Time
}

// Tenants is fleetd's tenants file (docs/tenancy.md) in force and the gate
// that applies it before any host is asked: key → tenant or 401, the
// tenant's models, output cap and rate limits. Create it with LoadTenants;
// a nil *Tenants is no tenants file. It is safe for concurrent use.
type Tenants struct {
	path string
	gate *tenant.Gate
	opts TenantsOptions
	log  *slog.Logger
	// down is set while the shared store is unreachable: from the warning
	// of an outage to the line that says it ended.
	down atomic.Bool

	mu    sync.Mutex // guards fstat and disagree
	fstat statusapi.File
	// disagree are the tenants whose limits another replica gives
	// otherwise, from ShareLimits's last round; nil: none, or not shared.
	disagree []statusapi.LimitsDisagreement
}

// LoadTenants reads the tenants file at path; a file that does not load is
// an error that lists every problem.
func LoadTenants(path string, opts TenantsOptions) (*Tenants, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c, raw, err := tenant.Load(path)
	if err != nil {
		return nil, err
	}
	ts := &Tenants{path: path, opts: opts, gate: tenant.NewGate(c, opts.Limiter), log: opts.Logger.With("component", "tenants"),
		fstat: statusapi.File{Path: path, SHA256: hash(raw), LoadedAt: opts.Now()}}
	opts.Metrics.tenantsReloaded(true)
	return ts, nil
}

func hash(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// Reload reads the tenants file again and puts it in force: requests in
// flight keep the tenant they were admitted as, and the buckets of tenants
// whose limits did not change are kept. A file that does not load changes
// nothing; its error is returned, shown in /status and in
// fleetd_tenants_file_last_reload_successful.
func (ts *Tenants) Reload() error {
	c, raw, err := tenant.Load(ts.path)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.opts.Metrics.tenantsReloaded(err == nil)
	if err != nil {
		msg := err.Error()
		ts.fstat.LastError = &msg
		return err
	}
	if h := hash(raw); h != ts.fstat.SHA256 {
		added, removed, changed := tenant.Diff(ts.gate.Config(), c)
		ts.gate.Set(c)
		ts.fstat = statusapi.File{Path: ts.path, SHA256: h, LoadedAt: ts.opts.Now()}
		ts.log.Info("tenants file reloaded", "path", ts.path, "sha256", h, "added", added, "removed", removed, "changed", changed)
	} else if ts.fstat.LastError != nil {
		ts.fstat.LastError = nil
		ts.log.Info("tenants file valid again; the tenants in force are unchanged", "path", ts.path)
	}
	return nil
}

// Watch reloads the tenants file each time changes reports it may have
// changed, until changes is closed.
func (ts *Tenants) Watch(changes <-chan struct{}) {
	for range changes {
		if err := ts.Reload(); err != nil {
			ts.log.Error("tenants file refused; keeping the tenants in force", "path", ts.path, "err", err)
		}
	}
}

// Status is the tenants file in force and where the limits are kept, for
// /status.
func (ts *Tenants) Status() (statusapi.File, statusapi.TenantLimits) {
	limits := statusapi.TenantLimits{Store: "memory", FailClosed: ts.opts.FailClosed, Reachable: !ts.down.Load()}
	if ts.opts.Shared {
		limits.Store = "redis"
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	limits.Disagreements = slices.Clone(ts.disagree)
	return ts.fstat, limits
}

// Unchecked is told of each request whose limits the shared store could not
// check at its admission (rdb.Limits.OnError): it is counted, and the first
// of an outage logged.
func (ts *Tenants) Unchecked(err error) {
	ts.opts.Metrics.limitsUnchecked("admit")
	ts.outage(err)
}

// ReserveUnchecked is told of each request whose worst case in tokens the
// shared store could not reserve (rdb.Limits.OnReserveError): it is counted,
// and the first of an outage logged.
func (ts *Tenants) ReserveUnchecked(err error) {
	ts.opts.Metrics.limitsUnchecked("reserve")
	ts.outage(err)
}

// SettleLost is told of each request whose settlement (its unused tokens
// given back, or those used beyond its reservation taken) the shared store
// could not apply (rdb.Limits.OnSettleError): it is counted, and the first
// of an outage logged.
func (ts *Tenants) SettleLost(err error) {
	ts.opts.Metrics.limitsUnchecked("settle")
	ts.outage(err)
}

// outage warns, once until it ends, that the shared store is unreachable.
func (ts *Tenants) outage(err error) {
	if !ts.down.CompareAndSwap(false, true) {
		return
	}
	what := "requests are let through unchecked until it answers (fail-open)"
	if ts.opts.FailClosed {
		what = "requests are refused with 429 until it answers (fail-closed)"
	}
	ts.log.Warn("tenant limits cannot be checked: the shared store is unreachable; "+what, "err", err)
}

// Recovered is told when the shared store answers again after an outage
// (rdb.Limits.OnRecover).
func (ts *Tenants) Recovered() {
	if ts.down.CompareAndSwap(true, false) {
		ts.log.Warn("tenant limits are checked again: the shared store answers")
	}
}
