package profile

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"
)

func load(t *testing.T, file string) *Config {
	t.Helper()
	c, data, err := Load("testdata/" + file)
	if err != nil {
		t.Fatalf("Load(%s): %v", file, err)
	}
	if len(data) == 0 {
		t.Fatalf("Load(%s) returned no bytes", file)
	}
	return c
}

func TestGoodFiles(t *testing.T) {
	type poolWant struct {
		name                    string
		minResidency, queueWait time.Duration
		maxQueue                int
	}
	type profileWant struct {
		id            string
		startup, stop time.Duration
		pools         []string
		argv, environ []string // on the profile's first pool, port 8001, self "/usr/bin/poold"
	}
	tests := []struct {
		file     string
		names    []string
		pools    []poolWant
		profiles []profileWant
	}{
		{
			file:  "good-design.json",
			names: []string{"chat", "qwen-7b", "qwen2.5-7b-instruct"},
			pools: []poolWant{
				{"gpu0", DefaultMinResidency, DefaultMaxQueueWait, DefaultMaxQueue},
				{"gpu12", DefaultMinResidency, DefaultMaxQueueWait, DefaultMaxQueue},
			},
			profiles: []profileWant{{
				id:      "qwen2.5-7b-instruct",
				startup: 20 * time.Minute, stop: 90 * time.Second,
				pools: []string{"gpu0", "gpu12"},
				argv: []string{"vllm", "serve", "--model", "/var/lib/poold/models/Qwen2.5-7B-Instruct",
					"--host", "127.0.0.1", "--port", "8001", "--served-model-name", "qwen2.5-7b-instruct",
					"--max-model-len", "32768", "--tensor-parallel-size", "1",
					"--gpu-memory-utilization", "0.90", "--enable-prefix-caching"},
				environ: []string{"HF_HUB_OFFLINE=1", "VLLM_USE_V1=1", "CUDA_VISIBLE_DEVICES=0"},
			}},
		},
		{
			file:  "good-minimal.json",
			names: []string{"m"},
			pools: []poolWant{
				{"a", DefaultMinResidency, DefaultMaxQueueWait, DefaultMaxQueue},
				{"b", DefaultMinResidency, DefaultMaxQueueWait, DefaultMaxQueue},
			},
			profiles: []profileWant{{
				id:      "m",
				startup: DefaultStartupTimeout, stop: DefaultStopTimeout,
				pools: []string{"a", "b"},
				argv: []string{"vllm", "serve", "--model", "org/m", "--host", "127.0.0.1", "--port", "8001",
					"--served-model-name", "m", "--tensor-parallel-size", "1"},
				environ: []string{"CUDA_VISIBLE_DEVICES=3"},
			}},
		},
		{
			file:  "good-command.json",
			names: []string{"big", "chat", "sim-a"},
			pools: []poolWant{
				{"gpu0", time.Minute, 2 * time.Minute, 8},
				{"gpu1", 5 * time.Second, 2 * time.Minute, 3},
			},
			profiles: []profileWant{
				{
					id:      "sim-a",
					startup: DefaultStartupTimeout, stop: time.Minute,
					pools: []string{"gpu1"},
					argv: []string{"sh", "-c",
						"exec /usr/bin/poold sim --port=8001 --model 'fake/model' --id sim-a --ttft 50ms"},
					environ: []string{"A=x", "HF_HUB_OFFLINE=0", "SIM=1", "CUDA_VISIBLE_DEVICES=1"},
				},
				{
					id:      "big",
					startup: DefaultStartupTimeout, stop: 5 * time.Second,
					pools: []string{"gpu0", "gpu1"},
					argv: []string{"vllm", "serve", "--model", "org/big", "--host", "127.0.0.1", "--port", "8001",
						"--served-model-name", "big", "--tensor-parallel-size=1"},
					environ: []string{"A=x", "HF_HUB_OFFLINE=1", "CUDA_VISIBLE_DEVICES=0"},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c := load(t, tt.file)
			if got := c.Names(); !slices.Equal(got, tt.names) {
				t.Errorf("Names() = %q, want %q", got, tt.names)
			}
			if len(c.Pools) != len(tt.pools) {
				t.Fatalf("%d pools, want %d", len(c.Pools), len(tt.pools))
			}
			for i, want := range tt.pools {
				p := c.Pools[i]
				if c.Pool(want.name) != p {
					t.Errorf("Pool(%q) is not pools[%d]", want.name, i)
				}
				if p.MinResidency.Duration != want.minResidency || p.MaxQueueWait.Duration != want.queueWait || p.MaxQueue != want.maxQueue {
					t.Errorf("pool %s: minResidency %v, maxQueueWait %v, maxQueue %d; want %v, %v, %d", p.Name,
						p.MinResidency, p.MaxQueueWait, p.MaxQueue, want.minResidency, want.queueWait, want.maxQueue)
				}
			}
			if len(c.Profiles) != len(tt.profiles) {
				t.Fatalf("%d profiles, want %d", len(c.Profiles), len(tt.profiles))
			}
			for i, want := range tt.profiles {
				p := c.Profiles[i]
				for _, n := range append([]string{p.ID}, p.Aliases...) {
					if c.Lookup(n) != p {
						t.Errorf("Lookup(%q) is not profiles[%d]", n, i)
					}
				}
				if p.ID != want.id {
					t.Errorf("profiles[%d].ID = %q, want %q", i, p.ID, want.id)
				}
				if p.StartupTimeout.Duration != want.startup || p.StopTimeout.Duration != want.stop {
					t.Errorf("%s: timeouts %v, %v; want %v, %v", p.ID, p.StartupTimeout, p.StopTimeout, want.startup, want.stop)
				}
				if !slices.Equal(p.Pools, want.pools) {
					t.Errorf("%s: Pools = %q, want %q", p.ID, p.Pools, want.pools)
				}
				for _, pool := range c.Pools {
					if got, want := p.EligibleOn(pool.Name), slices.Contains(want.pools, pool.Name); got != want {
						t.Errorf("%s: EligibleOn(%q) = %v, want %v", p.ID, pool.Name, got, want)
					}
				}
				pool := c.Pool(p.Pools[0])
				if got := p.Argv(8001, pool, Launch{Self: "/usr/bin/poold"}); !slices.Equal(got, want.argv) {
					t.Errorf("%s: Argv =\n%q\nwant\n%q", p.ID, got, want.argv)
				}
				if got := p.Environ(pool); !slices.Equal(got, want.environ) {
					t.Errorf("%s: Environ = %q, want %q", p.ID, got, want.environ)
				}
			}
			for _, n := range []string{"", "nope", "gpu9", "CHAT"} {
				if c.Lookup(n) != nil || c.Pool(n) != nil {
					t.Errorf("Lookup or Pool(%q) is not nil", n)
				}
			}
		})
	}
}

func TestArgv(t *testing.T) {
	pool2 := &PoolSpec{Name: "p", GPUs: []int{1, 2}}
	python := []string{"/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"}
	tests := []struct {
		name string
		p    Profile
		pool *PoolSpec
		vllm []string // the launcher: Launch.VLLM
		want []string
	}{
		{
			name: "vllm",
			p:    Profile{ID: "id", Model: "/m", MaxModelLen: 4096, Args: []string{"--x"}},
			pool: pool2,
			want: []string{"vllm", "serve", "--model", "/m", "--host", "127.0.0.1", "--port", "9000",
				"--served-model-name", "id", "--max-model-len", "4096", "--tensor-parallel-size", "2", "--x"},
		},
		{
			name: "vllm tp from args",
			p:    Profile{ID: "id", Model: "/m", Args: []string{"--tensor-parallel-size", "1"}},
			pool: pool2,
			want: []string{"vllm", "serve", "--model", "/m", "--host", "127.0.0.1", "--port", "9000",
				"--served-model-name", "id", "--tensor-parallel-size", "1"},
		},
		{
			name: "vllm -tp and no pool",
			p:    Profile{ID: "id", Model: "/m", Args: []string{"-tp=2"}},
			want: []string{"vllm", "serve", "--model", "/m", "--host", "127.0.0.1", "--port", "9000",
				"--served-model-name", "id", "-tp=2"},
		},
		{
			name: "a launcher of many words",
			p:    Profile{ID: "id", Model: "org/m", MaxModelLen: 8, Args: []string{"--x"}, Sleep: &Sleep{Level: 1}},
			pool: pool2,
			vllm: python,
			want: []string{"/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
				"--model", "org/m", "--host", "127.0.0.1", "--port", "9000", "--served-model-name", "id",
				"--max-model-len", "8", "--tensor-parallel-size", "2", "--enable-sleep-mode", "--x"},
		},
		{
			name: "a launcher of one word",
			p:    Profile{ID: "id", Model: "org/m", Args: []string{"--enable-sleep-mode", "-tp", "1"}, Sleep: &Sleep{Level: 1}},
			pool: pool2,
			vllm: []string{"/usr/local/bin/serve-vllm"},
			want: []string{"/usr/local/bin/serve-vllm", "--model", "org/m", "--host", "127.0.0.1", "--port", "9000",
				"--served-model-name", "id", "--enable-sleep-mode", "-tp", "1"},
		},
		{
			name: "command",
			p: Profile{ID: "sim", Model: "x/y", MaxModelLen: 1, Args: []string{"--unused"},
				Command: []string{"{poold}", "sim", "--listen=127.0.0.1:{port}", "{model}"}},
			pool: pool2,
			vllm: python, // unused
			want: []string{"/bin/poold", "sim", "--listen=127.0.0.1:9000", "x/y"},
		},
		{
			name: "sh -c",
			p: Profile{ID: "sim", Model: "x/y",
				Command: []string{"sh", "-c", "exec {poold} sim --port {port} --name {id}-{id} {model} # {unknown}"}},
			want: []string{"sh", "-c", "exec /bin/poold sim --port 9000 --name sim-sim x/y # {unknown}"},
		},
	}
	for _, tt := range tests {
		if got := tt.p.Argv(9000, tt.pool, Launch{Self: "/bin/poold", VLLM: tt.vllm}); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Argv =\n%q\nwant\n%q", tt.name, got, tt.want)
		}
	}
}

// The command lines of two profiles started by one launcher are their own,
// even when the launcher's slice has room to grow in.
func TestArgvOwnsItsCommandLine(t *testing.T) {
	vllm := append(make([]string, 0, 16), "vllm", "serve")
	launch := Launch{VLLM: vllm}
	a := (&Profile{ID: "a", Model: "org/a"}).Argv(9000, nil, launch)
	b := (&Profile{ID: "b", Model: "org/b"}).Argv(9001, nil, launch)
	if a[3] != "org/a" || b[3] != "org/b" || !slices.Equal(vllm, []string{"vllm", "serve"}) {
		t.Errorf("a = %q, b = %q, launcher %q", a, b, vllm)
	}
}

func TestEnviron(t *testing.T) {
	p := &Profile{Env: map[string]string{"B": "2", "A": "1", "CUDA_VISIBLE_DEVICES": "7"}}
	if got, want := p.Environ(&PoolSpec{GPUs: []int{3, 0}}), []string{"A=1", "B=2", "CUDA_VISIBLE_DEVICES=3,0"}; !slices.Equal(got, want) {
		t.Errorf("Environ = %q, want %q", got, want)
	}
	if got, want := p.Environ(nil), []string{"A=1", "B=2", "CUDA_VISIBLE_DEVICES=7"}; !slices.Equal(got, want) {
		t.Errorf("Environ(nil) = %q, want %q", got, want)
	}
}

// An engine inherits only the allowlisted variables of poold's environment
// and those its profile (or the file's defaults) names in passEnv: never
// poold's own settings, and the vLLM variables that change how poold talks
// to it only when named.
func TestInherited(t *testing.T) {
	environ := []string{
		"PATH=/usr/bin", "HOME=/var/lib/poold", "LC_ALL=C.UTF-8", "TZ=UTC",
		"POOLD_API_KEYS=sk-secret", "POOLD_ADMIN_TOKEN=admin-secret", "POOLD_ENGINE_TOKEN=old",
		"AWS_SECRET_ACCESS_KEY=aws", "MY_VAR=mine", "HTTPS_PROXY=http://u:p@proxy",
		"CUDA_HOME=/usr/local/cuda", "NCCL_DEBUG=INFO", "HF_HOME=/srv/hf", "VLLM_LOGGING_LEVEL=DEBUG",
		"VLLM_API_KEY=engine-key", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
		"NOEQUALS",
	}
	base := []string{"PATH=/usr/bin", "HOME=/var/lib/poold", "LC_ALL=C.UTF-8", "TZ=UTC",
		"CUDA_HOME=/usr/local/cuda", "NCCL_DEBUG=INFO", "HF_HOME=/srv/hf", "VLLM_LOGGING_LEVEL=DEBUG",
		"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}
	if got := (&Profile{}).Inherited(environ); !slices.Equal(got, base) {
		t.Errorf("Inherited =\n%q\nwant\n%q", got, base)
	}
	c, err := Parse([]byte(`{"pools": [{"name": "g", "gpus": [0]}],
	  "defaults": {"passEnv": ["HTTPS_PROXY"]},
	  "profiles": [{"id": "a", "model": "m", "passEnv": ["MY_VAR", "VLLM_API_KEY"]}, {"id": "b", "model": "m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/usr/bin", "HOME=/var/lib/poold", "LC_ALL=C.UTF-8", "TZ=UTC",
		"MY_VAR=mine", "HTTPS_PROXY=http://u:p@proxy",
		"CUDA_HOME=/usr/local/cuda", "NCCL_DEBUG=INFO", "HF_HOME=/srv/hf", "VLLM_LOGGING_LEVEL=DEBUG",
		"VLLM_API_KEY=engine-key", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}
	if got := c.Lookup("a").Inherited(environ); !slices.Equal(got, want) {
		t.Errorf("with passEnv: Inherited =\n%q\nwant\n%q", got, want)
	}
	want = slices.Insert(slices.Clone(base), 4, "HTTPS_PROXY=http://u:p@proxy")
	if got := c.Lookup("b").Inherited(environ); !slices.Equal(got, want) {
		t.Errorf("with defaults.passEnv: Inherited =\n%q\nwant\n%q", got, want)
	}
}

func TestLookupAllocs(t *testing.T) {
	c := load(t, "good-command.json")
	name := string([]byte("chat")) // not a constant, as in a request
	allocs := testing.AllocsPerRun(100, func() {
		if c.Lookup(name) == nil || c.Lookup("nope") != nil || c.Pool("gpu1") == nil {
			t.Fatal("lookup failed")
		}
		if !c.Profiles[0].EligibleOn("gpu1") {
			t.Fatal("not eligible")
		}
	})
	if allocs != 0 {
		t.Errorf("Lookup allocates %v times, want 0", allocs)
	}
}

func TestZeroConfig(t *testing.T) {
	var nilc *Config
	var zero Config
	for _, c := range []*Config{nilc, &zero} {
		if c.Lookup("x") != nil || c.Pool("x") != nil || len(c.Names()) != 0 {
			t.Errorf("%#v serves something", c)
		}
	}
}

func TestNamesIsACopy(t *testing.T) {
	c := load(t, "good-design.json")
	c.Names()[0] = "changed"
	if c.Names()[0] != "chat" {
		t.Error("Names shares its slice")
	}
}

func TestEqual(t *testing.T) {
	data, err := os.ReadFile("testdata/good-design.json")
	if err != nil {
		t.Fatal(err)
	}
	a, err1 := Parse(data)
	b, err2 := Parse(data)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	p, q := a.Profiles[0], b.Profiles[0]
	if !p.Equal(q) {
		t.Fatal("same definition is not Equal")
	}
	changes := []func(*Profile){
		func(p *Profile) { p.ID = "other" },
		func(p *Profile) { p.Aliases = p.Aliases[:1] },
		func(p *Profile) { p.Model = "other" },
		func(p *Profile) { p.Pools = []string{"gpu0"} },
		func(p *Profile) { p.MaxModelLen++ },
		func(p *Profile) { p.Args = append(slices.Clone(p.Args), "--x") },
		func(p *Profile) { p.Env = map[string]string{"A": "1"} },
		func(p *Profile) { p.Command = []string{"sh"} },
		func(p *Profile) { p.StartupTimeout.Duration++ },
		func(p *Profile) { p.StopTimeout.Duration++ },
		func(p *Profile) { p.Priority++ },
		func(p *Profile) { p.MinResidency = Duration{Duration: time.Minute} },
		func(p *Profile) { _ = json.Unmarshal([]byte(`"0s"`), &p.MinResidency) }, // set to zero is not unset
		func(p *Profile) { p.MaxQueueWait = Duration{Duration: time.Minute} },
	}
	for i, change := range changes {
		r := *q
		change(&r)
		if p.Equal(&r) || r.Equal(p) {
			t.Errorf("change %d: still Equal", i)
		}
	}
	// Durations compare by value, whatever their spelling.
	r := *q
	if err := json.Unmarshal([]byte(`"1200s"`), &r.StartupTimeout); err != nil {
		t.Fatal(err)
	}
	if !p.Equal(&r) {
		t.Error(`"20m" and "1200s" differ`)
	}
	if (*Profile)(nil).Equal(p) || !(*Profile)(nil).Equal(nil) {
		t.Error("nil Equal is wrong")
	}
}

func TestDurationJSON(t *testing.T) {
	var s struct {
		D Duration `json:"d,omitzero"`
	}
	if err := json.Unmarshal([]byte(`{"d": "1m30s"}`), &s); err != nil || s.D.Duration != 90*time.Second {
		t.Fatalf("Unmarshal = %v, %v", s.D, err)
	}
	if b, err := json.Marshal(s); err != nil || string(b) != `{"d":"1m30s"}` {
		t.Errorf("Marshal = %s, %v", b, err)
	}
	s.D = Duration{}
	if b, err := json.Marshal(s); err != nil || string(b) != `{}` {
		t.Errorf("Marshal(zero) = %s, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"d": null}`), &s); err != nil || !s.D.IsZero() {
		t.Errorf("Unmarshal(null) = %v, %v", s.D, err)
	}
	if err := json.Unmarshal([]byte(`{"d": 5}`), &s); err == nil {
		t.Error("Unmarshal(number) succeeded")
	}
}

// A profile's minResidency and maxQueueWait override its pool's; "0s" is an
// override too (no residency), and unset means the pool's.
func TestSchedulingOverrides(t *testing.T) {
	c := load(t, "good-command.json")
	gpu0, gpu1 := c.Pool("gpu0"), c.Pool("gpu1")
	simA, big := c.Lookup("sim-a"), c.Lookup("big")
	tests := []struct {
		p         *Profile
		pool      *PoolSpec
		residency time.Duration
		own       bool
		queueWait time.Duration
	}{
		{simA, gpu1, 0, true, 2 * time.Minute},
		{big, gpu0, 5 * time.Minute, true, 20 * time.Minute},
		{big, gpu1, 5 * time.Minute, true, 20 * time.Minute},
		{&Profile{ID: "plain"}, gpu1, 5 * time.Second, false, 2 * time.Minute},
		{&Profile{ID: "plain"}, gpu0, time.Minute, false, 2 * time.Minute},
	}
	for _, tt := range tests {
		if got, own := tt.p.Residency(tt.pool); got != tt.residency || own != tt.own {
			t.Errorf("%s on %s: Residency = %v, %v; want %v, %v", tt.p.ID, tt.pool.Name, got, own, tt.residency, tt.own)
		}
		if got := tt.p.QueueWait(tt.pool); got != tt.queueWait {
			t.Errorf("%s on %s: QueueWait = %v, want %v", tt.p.ID, tt.pool.Name, got, tt.queueWait)
		}
	}
}
