package pool

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/poold/poold/internal/profile"
)

// BenchmarkAdmitAtScale resolves a request's model and admits it on a ready
// pool (then releases the lease), at 10 and 10,000 profiles: the cost must not
// grow with the catalogue. The pool is never run: its scheduler and engine
// record are set by hand, as the placement tests do, so no process starts.
func BenchmarkAdmitAtScale(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("profiles=%d", n), func(b *testing.B) {
			var js strings.Builder
			js.WriteString(`{"pools":[{"name":"a","gpus":[0]},{"name":"b","gpus":[1]}],"profiles":[`)
			for i := range n {
				if i > 0 {
					js.WriteByte(',')
				}
				fmt.Fprintf(&js, `{"id":"model-%d","aliases":["alias-%d"],"model":"org/model-%d","command":["true","{port}"]}`, i, i, i)
			}
			js.WriteString(`]}`)
			cfg, err := profile.Parse([]byte(js.String()))
			if err != nil {
				b.Fatalf("Parse: %v", err)
			}
			name := fmt.Sprintf("alias-%d", n-1)
			prof := cfg.Lookup(name)
			s := NewSet(cfg, Options{})
			p := s.Pool("b")
			with(p, func(s *Scheduler) {
				s.Begin(prof.ID)
				s.Ready(prof.ID, time.Now().Add(-time.Hour))
			})
			p.mu.Lock()
			p.eng = &engine{profile: prof, port: 8000, target: loopbackURL(8000)}
			p.state = StateReady
			p.mu.Unlock()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := s.Acquire(ctx, cfg.Lookup(name), "", Caller{}, nil)
				if err != nil || l.Pool != "b" {
					b.Fatalf("Acquire: %v (pool %v)", err, l)
				}
				l.Release()
			}
		})
	}
}
