package fleet

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/poold/poold/internal/placement"
)

// unloadTimeout bounds one unload through a host's admin API: poold drains
// the pool first, as for a swap, so it may take as long as a stream.
const unloadTimeout = 5 * time.Minute

// scaleIn remembers the copies this fleetd loaded by scaling out, so that it
// unloads them again once their model has stayed unsaturated for its
// window. The zero value is ready to use.
type scaleIn struct {
	mu     sync.Mutex              // guards models
	models map[string]*scaledModel // by root
}

// scaledModel is what scale-in knows of one model.
type scaledModel struct {
	// extra maps each host where this fleetd scaled the model out to when.
	extra map[string]time.Time
	// calmSince is when the model was last seen with no saturated copy
	// after one was; zero while a copy is saturated, and before the first
	// look.
	calmSince time.Time
	// unloading is the host whose copy is being unloaded, or "".
	unloading string
}

// add records that this fleetd scaled root out to host at now.
func (s *scaleIn) add(root, host string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.models == nil {
		s.models = make(map[string]*scaledModel)
	}
	m := s.models[root]
	if m == nil {
		m = &scaledModel{extra: make(map[string]time.Time)}
		s.models[root] = m
	}
	m.extra[host] = now
	m.calmSince = time.Time{} // it scaled out because every copy was saturated
}

// roots returns the models with copies to watch.
func (s *scaleIn) roots() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for root := range s.models {
		out = append(out, root)
	}
	return out
}

// scalePlan is what one look at a model's copies decides.
type scalePlan struct {
	// calmSince is the model's new calm-since time (zero: a copy is
	// saturated).
	calmSince time.Time
	// unload is the host whose extra copy to unload now, or "".
	unload string
	// gone are the extra copies no longer awake or loading, a window after
	// they were loaded: their hosts' schedulers gave the pools to other
	// work, and scale-in forgets them.
	gone []string
}

// planScaleIn is scale-in's policy for one model, from order (Route's
// output for it), the extra copies this fleetd loaded by scaling out, when
// the model was last calm, and the model's bounds: once no awake copy has
// been saturated for a whole window and more than MinCopies are awake, the
// least loaded extra copy is unloaded, one per window.
func planScaleIn(order []Choice, extra map[string]time.Time, calmSince, now time.Time, spec ModelSpec) scalePlan {
	plan := scalePlan{calmSince: calmSince}
	byHost := make(map[string]Choice, len(order))
	awake, saturated := 0, false
	for _, c := range order {
		byHost[c.Host] = c
		if c.Rank == placement.Awake {
			awake++
			saturated = saturated || c.Saturated
		}
	}
	switch {
	case saturated || awake == 0:
		plan.calmSince = time.Time{}
	case plan.calmSince.IsZero():
		plan.calmSince = now
	}
	var candidates []Choice
	for host, at := range extra {
		c, ok := byHost[host]
		switch {
		case ok && c.Rank == placement.Awake:
			candidates = append(candidates, c)
		case ok && c.Rank == placement.Loading, now.Sub(at) < spec.window:
		default:
			plan.gone = append(plan.gone, host)
		}
	}
	slices.Sort(plan.gone)
	if plan.calmSince.IsZero() || now.Sub(plan.calmSince) < spec.window || awake <= spec.MinCopies || len(candidates) == 0 {
		return plan
	}
	best := slices.MinFunc(candidates, func(a, b Choice) int { return cmp.Or(cmp.Compare(a.Load, b.Load), cmp.Compare(a.Host, b.Host)) })
	plan.unload, plan.calmSince = best.Host, now // the next one a window later
	return plan
}

// runScaleIn looks at the models this fleetd scaled out every poll
// interval, and unloads their extra copies as planScaleIn says, until ctx
// ends.
func (f *Fleet) runScaleIn(ctx context.Context) {
	t := time.NewTicker(f.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, root := range f.scale.roots() {
			f.scaleInModel(ctx, root)
		}
	}
}

// scaleInModel applies planScaleIn to root's copies now.
func (f *Fleet) scaleInModel(ctx context.Context, root string) {
	now := f.opts.Now()
	views, _ := f.views(f.snapshot(), root, "", nil)
	order := Route(views, "", f.routeOptions(now))
	spec := f.model(root, root)
	f.scale.mu.Lock()
	defer f.scale.mu.Unlock()
	m := f.scale.models[root]
	if m == nil || m.unloading != "" {
		return
	}
	plan := planScaleIn(order, m.extra, m.calmSince, now, spec)
	m.calmSince = plan.calmSince
	for _, host := range plan.gone {
		delete(m.extra, host)
		f.metrics.scale("in", "gone")
		f.log.Info("scale-in: the extra copy left by itself", "model", root, "host", host)
	}
	if plan.unload == "" {
		if len(m.extra) == 0 {
			delete(f.scale.models, root)
		}
		return
	}
	if f.opts.AdminToken == "" {
		f.log.Info("scale-in: an extra copy is no longer needed, but without the hosts' admin token it stays until its host's scheduler needs the pool",
			"model", root, "host", plan.unload)
		delete(m.extra, plan.unload)
		f.metrics.scale("in", "no-token")
		return
	}
	v := views[slices.IndexFunc(views, func(v HostView) bool { return v.Name == plan.unload })]
	h := f.snapshot()[plan.unload]
	m.unloading = plan.unload
	f.wg.Go(func() {
		err := f.unload(ctx, h, v, root)
		f.scale.mu.Lock()
		defer f.scale.mu.Unlock()
		m.unloading = ""
		if err != nil {
			f.metrics.scale("in", "failed")
			f.log.Warn("scale-in: unload failed", "model", root, "host", v.Name, "err", err)
			return // tried again after another window
		}
		delete(m.extra, v.Name)
		f.metrics.scale("in", "unloaded")
		f.log.Info("scale-in: unloaded an extra copy", "model", root, "host", v.Name)
	})
}

// unload unloads root from the pool of h (seen as v) where it is awake,
// through poold's admin API.
func (f *Fleet) unload(ctx context.Context, h *host, v HostView, root string) error {
	i := slices.IndexFunc(v.Pools, func(p PoolView) bool { return p.Profile == root && p.SwitchingTo == "" })
	if h == nil || i < 0 {
		return fmt.Errorf("host %s: no pool holds %s", v.Name, root)
	}
	ctx, cancel := context.WithTimeout(ctx, unloadTimeout)
	defer cancel()
	u := h.base.JoinPath("admin", "pools", v.Pools[i].Name, "unload")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return fmt.Errorf("POST %s: %w", u, err)
	}
	req.Header.Set("Authorization", "Bearer "+f.opts.AdminToken)
	resp, err := f.opts.Client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("POST %s: status %s: %s", u, resp.Status, body)
	}
	h.poke() // the next poll shows the pool empty
	return nil
}
