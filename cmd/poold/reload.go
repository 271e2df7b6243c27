package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/poold/poold/internal/metrics"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/proxy"
	"github.com/poold/poold/internal/statusapi"
	"github.com/poold/poold/internal/watch"
)

// reloader applies a new profiles file to the running daemon: it reads and
// validates the whole file, applies it to the pools and then to the proxy, and
// records the outcome in /status, the metrics, the log and systemd's state. A
// file that does not load changes nothing.
type reloader struct {
	path   string
	pools  *pool.Set
	h      *proxy.Handler
	m      *metrics.Metrics
	notify *notifier
	log    *slog.Logger
	// cfg is the profiles in force; only the reloading goroutine uses it
	// once the reloader runs.
	cfg *profile.Config

	mu       sync.Mutex // guards the fields below
	sum      [sha256.Size]byte
	loadedAt time.Time
	lastErr  error // the last reload's refusal; nil after a good one
}

// reload loads the file and applies it if it differs from the one in force
// (or the last reload was refused).
func (r *reloader) reload(trigger string) {
	cfg, raw, err := profile.Load(r.path)
	sum := sha256.Sum256(raw)
	r.mu.Lock()
	unchanged := err == nil && sum == r.sum && r.lastErr == nil
	r.mu.Unlock()
	if unchanged {
		level := slog.LevelDebug
		if trigger == "SIGHUP" {
			level = slog.LevelInfo // asked for by an operator: say what happened
		}
		r.log.Log(context.Background(), level, "profiles unchanged", "trigger", trigger, "path", r.path)
		return
	}
	r.notify.reloading()
	defer r.notify.ready()
	now := time.Now()
	if err != nil {
		r.log.Error("profiles reload refused; the running profiles stay in force", "trigger", trigger, "path", r.path, "err", err)
		r.m.ConfigLoaded(false, now)
		r.mu.Lock()
		r.lastErr = err
		r.mu.Unlock()
		return
	}
	diff := profile.Diff(r.cfg, cfg)
	notes := r.pools.Apply(cfg)
	r.h.SetConfig(cfg)
	r.m.Configure(cfg)
	r.cfg = cfg
	for _, n := range notes {
		r.log.Info("profiles reload", "change", n)
	}
	r.m.ConfigLoaded(true, now)
	r.mu.Lock()
	r.sum, r.loadedAt, r.lastErr = sum, now, nil
	r.mu.Unlock()
	r.log.Info("profiles reloaded", append([]any{"trigger", trigger, "path", r.path, "sha256", hex.EncodeToString(sum[:])}, changeAttrs(diff)...)...)
}

// changeAttrs are the log attributes that say what a reload changed: the
// profiles added, removed and changed, the pools added, removed and changed,
// and every pool affected; only the lists that are not empty, or
// "no_change" when all are.
func changeAttrs(c profile.Changes) []any {
	if c.None() {
		return []any{"no_change", true}
	}
	var attrs []any
	for _, l := range []struct {
		key   string
		names []string
	}{
		{"profiles_added", c.ProfilesAdded}, {"profiles_removed", c.ProfilesRemoved}, {"profiles_changed", c.ProfilesChanged},
		{"pools_added", c.PoolsAdded}, {"pools_removed", c.PoolsRemoved}, {"pools_changed", c.PoolsChanged},
		{"pools_affected", c.PoolsAffected},
	} {
		if len(l.names) > 0 {
			attrs = append(attrs, l.key, l.names)
		}
	}
	if c.SleepMemoryBudget {
		attrs = append(attrs, "sleep_memory_budget_changed", true)
	}
	return attrs
}

// status is the "config" part of /status.
func (r *reloader) status() statusapi.File {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := statusapi.File{Path: r.path, SHA256: hex.EncodeToString(r.sum[:]), LoadedAt: r.loadedAt}
	if r.lastErr != nil {
		msg := r.lastErr.Error()
		st.LastError = &msg
	}
	return st
}

// start runs the reloader until ctx ends: on SIGHUP and, when watchFile is
// set, on changes to the profiles file. The returned function waits until
// the reloader has ended, so that no reload runs into the shutdown.
func (r *reloader) start(ctx context.Context, watchFile bool, debounce time.Duration) (wait func()) {
	return reloadOn(ctx, r.path, "profiles", watchFile, debounce, r.log, r.reload)
}

// reloadOn calls reload, with what triggered it, on every SIGHUP and, when
// watchFile is set, on every change to the file at path (named what in
// the log), until ctx ends. With a watch, it first reloads once, for a
// change made between the daemon's first read and the watch's start.
// SIGHUP is caught from now on (its default action would end the daemon).
// The returned function waits until the reloads have ended.
func reloadOn(ctx context.Context, path, what string, watchFile bool, debounce time.Duration, log *slog.Logger, reload func(trigger string)) (wait func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var events <-chan struct{}
	if watchFile {
		var err error
		if events, err = watch.File(ctx, path, debounce, log); err != nil {
			log.Warn("not watching the "+what+" file; SIGHUP still reloads", "err", err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer signal.Stop(hup)
		if events != nil {
			reload("watch started")
		}
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-events:
				if !ok {
					events = nil // the watcher ended with ctx
					continue
				}
				reload("file changed")
			case <-hup:
				reload("SIGHUP")
			}
		}
	}()
	return func() { <-done }
}
