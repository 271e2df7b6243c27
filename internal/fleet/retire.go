package fleet

import (
	"maps"
	"time"
)

// A change of membership (the hosts file, a DNS answer) that removes hosts
// and adds others keeps the removed ones routing until every added one has
// had a successful poll, or retireAfter has passed: until then the added
// hosts are unknown to routing (they list no model yet), and a model that
// the removed hosts served and the added ones serve too would be answered
// 404 model_not_found in between. A removed host whose name comes back
// with an added one (a new URL) routes in its place meanwhile.

// retireAfter bounds how long removed hosts wait for the added ones: the
// first poll, and one more after a failure (at once after a timeout, a
// poll interval after another failure).
func (f *Fleet) retireAfter() time.Duration {
	return f.opts.PollInterval + 2*f.opts.PollTimeout
}

// retireLocked takes the hosts gone out of the fleet, after started were
// added: at once when none of the hosts added awaits its first poll, else
// once they have it (polledOnce) or after retireAfter. It then publishes
// the routing set. f.mu is held.
func (f *Fleet) retireLocked(gone, started []*host) {
	for _, h := range started {
		f.awaiting[h] = true
	}
	for _, h := range gone {
		if old := f.retiring[h.name]; old != nil {
			delete(f.retiring, h.name)
			f.stopLocked(old)
		}
		if len(f.awaiting) == 0 {
			f.stopLocked(h)
			continue
		}
		f.retiring[h.name] = h
		f.log.Info("host leaving: routed to until the hosts added have been polled", "host", h.name, "within", f.retireAfter())
	}
	if len(started) > 0 || len(f.retiring) > 0 {
		time.AfterFunc(f.retireAfter(), func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.ctx.Err() != nil {
				return // Run has ended, and with it every poller
			}
			for _, h := range started {
				delete(f.awaiting, h)
			}
			for _, h := range gone {
				if f.retiring[h.name] == h {
					delete(f.retiring, h.name)
					f.stopLocked(h)
				}
			}
			f.routeLocked()
		})
	}
	f.routeLocked()
}

// polledOnce is told by h's poller of its first successful poll: once no
// host added awaits one, the retiring hosts leave; a retiring host of h's
// name leaves at once.
func (f *Fleet) polledOnce(h *host) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.awaiting[h] {
		return
	}
	delete(f.awaiting, h)
	for name, old := range f.retiring {
		if len(f.awaiting) == 0 || name == h.name {
			delete(f.retiring, name)
			f.stopLocked(old)
		}
	}
	f.routeLocked()
}

// routeLocked publishes the routing set: the fleet's hosts and the retiring
// ones, a retiring host in place of an added one of its name that awaits its
// first poll. f.mu is held.
func (f *Fleet) routeLocked() {
	hosts := maps.Clone(f.hosts)
	for name, old := range f.retiring {
		if h, ok := hosts[name]; !ok || f.awaiting[h] {
			hosts[name] = old
		}
	}
	f.routing.Store(&hosts)
}
