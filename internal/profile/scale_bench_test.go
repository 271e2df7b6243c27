package profile

import (
	"fmt"
	"strings"
	"testing"
)

// scaleConfig is a profiles file with n simulator profiles on one pool, each
// with an alias.
func scaleConfig(tb testing.TB, n int) *Config {
	tb.Helper()
	var b strings.Builder
	b.WriteString(`{"pools":[{"name":"a","gpus":[0]}],"profiles":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"model-%d","aliases":["alias-%d"],"model":"org/model-%d","command":["true","{port}"]}`, i, i, i)
	}
	b.WriteString(`]}`)
	cfg, err := Parse([]byte(b.String()))
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	return cfg
}

// BenchmarkLookupAtScale resolves a name at 10 and 10,000 profiles: the cost
// must not grow with the catalogue and the lookup must not allocate.
func BenchmarkLookupAtScale(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("profiles=%d", n), func(b *testing.B) {
			cfg := scaleConfig(b, n)
			names := []string{"model-0", fmt.Sprintf("alias-%d", n-1), fmt.Sprintf("model-%d", n/2)}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if cfg.Lookup(names[i%len(names)]) == nil {
					b.Fatal("name not found")
				}
				i++
			}
		})
	}
}
