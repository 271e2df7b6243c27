package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/tenant"
)

// tenantsFile keeps the tenants file in force: read at start (a file that
// does not load stops poold from starting), then reloaded when it changes
// and on SIGHUP. A reload that does not load changes nothing: the tenants
// in force stay, and the refusal shows in the log, /status and
// poold_tenants_last_reload_successful. Requests in flight keep the tenant
// they were admitted as.
type tenantsFile struct {
	path string
	gate *tenant.Gate
	m    metrics.FileReload
	log  *slog.Logger

	mu       sync.Mutex // guards the fields below
	sum      [sha256.Size]byte
	loadedAt time.Time
	lastErr  error // the last reload's refusal; nil after a good one
}

// openTenants loads the tenants file at path into a gate; with no path it
// returns a nil *tenantsFile, whose gate is nil: no tenancy.
func openTenants(path string, reg prometheus.Registerer, log *slog.Logger) (*tenantsFile, error) {
	if path == "" {
		return nil, nil
	}
	cfg, raw, err := tenant.Load(path)
	if err != nil {
		return nil, fmt.Errorf("loading tenants:\n%w", err)
	}
	t := &tenantsFile{path: path, gate: tenant.NewGate(cfg, nil), m: metrics.NewTenantsReload(reg),
		log: log.With("component", "tenants"), sum: sha256.Sum256(raw), loadedAt: time.Now()}
	t.m.Loaded(true, t.loadedAt)
	t.log.Info("tenants loaded", "path", path, "tenants", len(cfg.Tenants))
	return t, nil
}

// Gate is the gate of the tenants in force; nil without a file.
func (t *tenantsFile) Gate() *tenant.Gate {
	if t == nil {
		return nil
	}
	return t.gate
}

// reload loads the file and puts it in force if it differs from the one in
// force (or the last reload was refused).
func (t *tenantsFile) reload(trigger string) {
	cfg, raw, err := tenant.Load(t.path)
	sum := sha256.Sum256(raw)
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.log.Error("tenants reload refused; the tenants in force stay", "trigger", trigger, "path", t.path, "err", err)
		t.m.Loaded(false, now)
		t.lastErr = err
		return
	case sum == t.sum && t.lastErr == nil:
		t.log.Debug("tenants unchanged", "trigger", trigger, "path", t.path)
		return
	}
	added, removed, changed := tenant.Diff(t.gate.Config(), cfg)
	t.gate.Set(cfg)
	t.m.Loaded(true, now)
	t.sum, t.loadedAt, t.lastErr = sum, now, nil
	t.log.Info("tenants reloaded", "trigger", trigger, "path", t.path, "sha256", hex.EncodeToString(sum[:]),
		"added", added, "removed", removed, "changed", changed)
}

// status is the "tenants" part of /status; nil without a file.
func (t *tenantsFile) status() *statusapi.File {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st := &statusapi.File{Path: t.path, SHA256: hex.EncodeToString(t.sum[:]), LoadedAt: t.loadedAt}
	if t.lastErr != nil {
		msg := t.lastErr.Error()
		st.LastError = &msg
	}
	return st
}

// start reloads the file on SIGHUP and, with watchFile, when it changes,
// until ctx ends; the returned function waits for the end. A nil
// *tenantsFile has nothing to do.
func (t *tenantsFile) start(ctx context.Context, watchFile bool, debounce time.Duration) (wait func()) {
	if t == nil {
		return func() {}
	}
	return reloadOn(ctx, t.path, "tenants", watchFile, debounce, t.log, t.reload)
}
