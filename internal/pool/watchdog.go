package pool

import (
	"fmt"
	"time"
)

// Healthy reports whether every pool's state can still be read within
// timeout: a run loop or request stuck while holding a pool's mutex (the only
// way a pool stops answering) makes it return an error naming that pool. It
// polls with TryLock, so a stuck pool costs no goroutine. The systemd
// watchdog pings only while this holds.
func (s *Set) Healthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range s.Pools() {
		for !p.mu.TryLock() {
			if time.Now().After(deadline) {
				return fmt.Errorf("pool %q: its state has been locked for over %s", p.name, timeout)
			}
			time.Sleep(time.Millisecond)
		}
		p.mu.Unlock()
	}
	return nil
}
