package profile

import (
	"slices"
	"testing"
	"time"
)

func TestSleepSettings(t *testing.T) {
	c := load(t, "good-sleep.json")
	if got := c.Defaults.SleepMemoryBudget; got != 64<<30 {
		t.Errorf("sleepMemoryBudget = %d, want %d", got, int64(64<<30))
	}
	if a, b := c.Pool("gpu0").MaxSleeping, c.Pool("gpu1").MaxSleeping; a != 2 || b != DefaultMaxSleeping {
		t.Errorf("maxSleeping = %d, %d; want 2, %d", a, b, DefaultMaxSleeping)
	}
	pool := c.Pool("gpu0")
	tests := []struct {
		id        string
		level     int
		weight    int64
		residency time.Duration
		argv      []string
		environ   []string
	}{
		{
			id: "chat", level: 1, weight: 16e9, residency: DefaultSleepMinResidency,
			argv: []string{"vllm", "serve", "--model", "org/chat", "--host", "127.0.0.1", "--port", "8001",
				"--served-model-name", "chat", "--tensor-parallel-size", "1", "--enable-sleep-mode"},
			// Sleep mode needs the dev endpoints: VLLM_SERVER_DEV_MODE=1 wins over the profile's.
			environ: []string{"VLLM_SERVER_DEV_MODE=1", "CUDA_VISIBLE_DEVICES=0"},
		},
		{
			id: "coder", level: 2, residency: 20 * time.Second,
			argv: []string{"vllm", "serve", "--model", "org/coder", "--host", "127.0.0.1", "--port", "8001",
				"--served-model-name", "coder", "--tensor-parallel-size", "1", "--enable-sleep-mode"},
			environ: []string{"VLLM_SERVER_DEV_MODE=1", "CUDA_VISIBLE_DEVICES=0"},
		},
		{
			id: "sim", level: 1, residency: DefaultSleepMinResidency,
			argv:    []string{"/bin/poold", "engine-sim", "--port", "8001", "--enable-sleep-mode"},
			environ: []string{"VLLM_SERVER_DEV_MODE=1", "CUDA_VISIBLE_DEVICES=0"},
		},
	}
	for _, tt := range tests {
		p := c.Lookup(tt.id)
		if p.SleepLevel() != tt.level || p.WeightBytes != tt.weight {
			t.Errorf("%s: sleep level %d, weightBytes %d; want %d, %d", tt.id, p.SleepLevel(), p.WeightBytes, tt.level, tt.weight)
		}
		if d, own := p.Residency(pool); d != tt.residency || !own {
			t.Errorf("%s: Residency = %v, %v; want %v, true", tt.id, d, own, tt.residency)
		}
		if got := p.Argv(8001, pool, Launch{Self: "/bin/poold"}); !slices.Equal(got, tt.argv) {
			t.Errorf("%s: Argv = %q, want %q", tt.id, got, tt.argv)
		}
		if got := p.Environ(pool); !slices.Equal(got, tt.environ) {
			t.Errorf("%s: Environ = %q, want %q", tt.id, got, tt.environ)
		}
	}
	// The sleep default only ever shortens the pool's residency.
	short := &PoolSpec{MinResidency: Duration{Duration: time.Second}}
	if d, _ := c.Lookup("chat").Residency(short); d != time.Second {
		t.Errorf("Residency on a 1s pool = %v, want 1s", d)
	}
	// Sleep settings are part of a profile's definition.
	q := *c.Lookup("chat")
	q.Sleep = &Sleep{Level: 2}
	if q.Equal(c.Lookup("chat")) {
		t.Error("profiles differing in sleep level are Equal")
	}
}
