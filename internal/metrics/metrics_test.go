package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/poold/poold/internal/gpu"
	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/statusapi"
)

// fakeGPUs is a gpu.Provider with fixed devices.
type fakeGPUs []gpu.Device

func (f fakeGPUs) Available() (bool, string)      { return true, "" }
func (f fakeGPUs) Devices() ([]gpu.Device, error) { return f, nil }

var twoGPUs = fakeGPUs{
	{Index: 0, UUID: "GPU-aaa", MemoryUsedBytes: 70 << 30, MemoryTotalBytes: 80 << 30, Utilization: 0.93, TemperatureC: 61, PowerWatts: 412.5, Processes: []gpu.Process{{PID: 4242, UsedBytes: 69 << 30}},
		ECCErrors: &gpu.ECCErrors{Corrected: 120, Uncorrected: 2}},
	{Index: 1, UUID: "GPU-bbb", MemoryUsedBytes: 1 << 20, MemoryTotalBytes: 80 << 30},
}

// newLoaded builds a registry with every poold collector, and gives every
// labelled metric at least one series, as a busy daemon would.
func newLoaded(t testing.TB, gpus gpu.Provider) (*prometheus.Registry, *Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	prof, hitRate := "qwen", 0.25
	pools := func() []statusapi.Pool {
		return []statusapi.Pool{{Name: "gpu0", GPUs: []int{0}, State: statusapi.StateReady, Profile: &prof, InFlight: 2, Waiting: map[string]int{"llama": 1},
			Sleeping: []statusapi.Sleeper{{Profile: "llama", Level: 1}},
			Engine:   &statusapi.Engine{Profile: prof}, EngineStats: &statusapi.EngineStats{Running: 2, Waiting: 11, KVCacheUsage: 0.9, PrefixCacheHitRate: &hitRate}}}
	}
	m := New(reg, pools, "v1.2.3", "abc123")
	reg.MustRegister(GPUCollector(gpus))
	m.ConfigLoaded(true, time.Unix(1700000000, 0))
	m.Swap("gpu0", "llama", "qwen", pool.KindCold, "ok", map[string]time.Duration{"drain": time.Second, "stop": 2 * time.Second, "vram_release": 300 * time.Millisecond, "start": time.Millisecond, "ready": 20 * time.Second})
	m.Swap("gpu0", "qwen", "llama", pool.KindWake, "ok", map[string]time.Duration{"drain": time.Second, "sleep": time.Second, "wake": 200 * time.Millisecond})
	m.EngineExit("gpu0", "llama", "stopped")
	m.VRAMNotReleased("gpu0")
	m.SleepVRAMNotReleased("gpu0")
	m.IdleRelease("gpu0", "qwen", "sleep")
	m.EngineScrapeFailed("gpu0")
	m.EngineLogDropped("gpu0", pool.DropOwnPoll)
	m.Observe(&record.Request{Pool: "gpu0", Model: "chat", Profile: "qwen", Client: "team-a", Status: 200, Stream: true, Counted: true,
		PromptTokens: 12, CompletionTokens: 34, QueueWait: 5 * time.Second, TTFB: 5100 * time.Millisecond, Duration: 9 * time.Second,
		TTFT: 5200 * time.Millisecond})
	m.ITL("gpu0", "qwen", "team-a").Observe(0.02)
	return reg, m
}

func TestRegistryLintsClean(t *testing.T) {
	reg, _ := newLoaded(t, twoGPUs)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// A profile id is labelled profile on every series that carries one (a
// swap's two, from and to), so that one matcher or join selects a profile
// across the request, engine and pool series.
func TestProfileIDsAreLabelledProfile(t *testing.T) {
	reg, _ := newLoaded(t, twoGPUs)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byProfile := map[string]bool{
		"poold_requests_total": true, "poold_request_duration_seconds": true, "poold_time_to_first_byte_seconds": true,
		"poold_queue_wait_seconds": true, "poold_time_to_first_token_seconds": true, "poold_inter_token_latency_seconds": true,
		"poold_prompt_tokens_total": true, "poold_completion_tokens_total": true,
		"poold_in_flight_requests": true, "poold_waiting_requests": true, "poold_pool_loaded_profile": true,
		"poold_engine_requests_running": true, "poold_engine_requests_waiting": true,
		"poold_engine_kv_cache_usage_ratio": true, "poold_engine_prefix_cache_hit_ratio": true,
		"poold_engine_starts_total": true, "poold_engine_exits_total": true, "poold_idle_releases_total": true,
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		for _, s := range mf.GetMetric() {
			has := false
			for _, l := range s.GetLabel() {
				switch n, v := l.GetName(), l.GetValue(); {
				case n == "profile":
					has = true
				case v == "qwen" || v == "llama": // newLoaded's profile ids
					if name != "poold_swaps_total" || n != "from" && n != "to" {
						t.Errorf("%s: profile id %q labelled %s, want profile", name, v, n)
					}
				case n == "model":
					t.Errorf("%s: a model label (%q); poold labels profile ids profile", name, v)
				}
			}
			if byProfile[name] && !has {
				t.Errorf("%s: series without a profile label: %v", name, s.GetLabel())
			}
			if has && !byProfile[name] {
				t.Errorf("%s has a profile label: add it to this test and to docs/observability.md", name)
			}
		}
		if len(mf.GetMetric()) > 0 {
			seen[name] = true
		}
	}
	for name := range byProfile {
		if !seen[name] {
			t.Errorf("%s: no series exported; newLoaded should give it one", name)
		}
	}
}

func TestObserveCountsTokensPerClient(t *testing.T) {
	reg, m := newLoaded(t, twoGPUs)
	m.Observe(&record.Request{Pool: "gpu0", Profile: "qwen", Client: "team-a", Status: 200, Counted: true, PromptTokens: 1, CompletionTokens: 2, QueueWait: 2 * time.Second})
	m.Observe(&record.Request{Model: "nope", Client: record.NoTenant, Status: 404})                              // never reached a pool
	m.Observe(&record.Request{Model: "chat", Client: "team-b", Status: 429, Outcome: record.OutcomeRateLimited}) // refused by its limits
	want := `
# HELP poold_completion_tokens_total Completion tokens reported by the engines (or estimated, for a cut stream), by pool, profile and client (the tenant).
# TYPE poold_completion_tokens_total counter
poold_completion_tokens_total{client="team-a",pool="gpu0",profile="qwen"} 36
# HELP poold_requests_total Requests answered, by pool, profile (the canonical profile id), status class, streaming, client (the tenant) and outcome (completed, upstream_aborted, client_aborted, client_stalled, shutdown_cut, rate_limited).
# TYPE poold_requests_total counter
poold_requests_total{client="none",code_class="4xx",outcome="completed",pool="none",profile="none",stream="false"} 1
poold_requests_total{client="team-a",code_class="2xx",outcome="completed",pool="gpu0",profile="qwen",stream="false"} 1
poold_requests_total{client="team-a",code_class="2xx",outcome="completed",pool="gpu0",profile="qwen",stream="true"} 1
poold_requests_total{client="team-b",code_class="4xx",outcome="rate_limited",pool="none",profile="none",stream="false"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "poold_requests_total", "poold_completion_tokens_total"); err != nil {
		t.Fatal(err)
	}
	// The tenant's wait: 5 s and 2 s for team-a; none recorded for requests that reached no pool.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var waited float64
	var clients []string
	for _, mf := range mfs {
		if mf.GetName() == "poold_client_queue_wait_seconds" {
			for _, s := range mf.GetMetric() {
				clients = append(clients, label(s, "client"))
				waited += s.GetHistogram().GetSampleSum()
			}
		}
	}
	if strings.Join(clients, ",") != "team-a" || waited != 7 {
		t.Fatalf("client queue wait: clients %v, %g s; want team-a, 7 s", clients, waited)
	}
}

func TestSwapPhases(t *testing.T) {
	reg, _ := newLoaded(t, twoGPUs)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	phases := map[string]uint64{} // kind/phase → samples
	for _, mf := range mfs {
		if mf.GetName() != "poold_swap_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			phases[label(m, "kind")+"/"+label(m, "phase")] = m.GetHistogram().GetSampleCount()
		}
	}
	for _, p := range []string{"cold/drain", "cold/stop", "cold/vram_release", "cold/start", "cold/ready", "wake/drain", "wake/sleep", "wake/wake"} {
		if phases[p] != 1 {
			t.Errorf("phase %s observed %d times, want 1 (all: %v)", p, phases[p], phases)
		}
	}
	if len(phases) != 8 {
		t.Errorf("phases %v, want the 8 above", phases)
	}
	// A wake starts no engine: only the cold swap counts in engine starts.
	want := `
# HELP poold_engine_starts_total Engine starts, by result (ok, failed).
# TYPE poold_engine_starts_total counter
poold_engine_starts_total{pool="gpu0",profile="qwen",result="ok"} 1
# HELP poold_sleeping_engines Engines asleep in each pool (sleep mode).
# TYPE poold_sleeping_engines gauge
poold_sleeping_engines{pool="gpu0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "poold_engine_starts_total", "poold_sleeping_engines"); err != nil {
		t.Error(err)
	}
	if n := testutil.ToFloat64(prometheus.Collector(regCounter(t, reg, "poold_vram_not_released_total"))); n != 1 {
		t.Errorf("poold_vram_not_released_total = %v, want 1", n)
	}
	if n := testutil.ToFloat64(prometheus.Collector(regCounter(t, reg, "poold_sleep_vram_not_released_total"))); n != 1 {
		t.Errorf("poold_sleep_vram_not_released_total = %v, want 1", n)
	}
	if n := testutil.ToFloat64(prometheus.Collector(regCounter(t, reg, "poold_engine_metrics_scrape_failures_total"))); n != 1 {
		t.Errorf("poold_engine_metrics_scrape_failures_total = %v, want 1", n)
	}
	if n := testutil.ToFloat64(prometheus.Collector(regCounter(t, reg, "poold_engine_log_dropped_lines_total"))); n != 1 {
		t.Errorf("poold_engine_log_dropped_lines_total = %v, want 1", n)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// regCounter returns a collector that re-exports one gathered counter family,
// so testutil.ToFloat64 can read it.
func regCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "copy"})
			c.Add(mf.GetMetric()[0].GetCounter().GetValue())
			return c
		}
	}
	t.Fatalf("no single-series counter %s", name)
	return nil
}

func TestGPUCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(GPUCollector(twoGPUs))
	// GPU 1 has no ECC: no series.
	want := `
# HELP poold_gpu_ecc_errors_total ECC memory errors since the driver last loaded (NVML's volatile counters), by type (corrected, uncorrected); absent where ECC is off.
# TYPE poold_gpu_ecc_errors_total counter
poold_gpu_ecc_errors_total{gpu="0",type="corrected",uuid="GPU-aaa"} 120
poold_gpu_ecc_errors_total{gpu="0",type="uncorrected",uuid="GPU-aaa"} 2
# HELP poold_gpu_memory_used_bytes GPU memory in use, per GPU (NVML index).
# TYPE poold_gpu_memory_used_bytes gauge
poold_gpu_memory_used_bytes{gpu="0",uuid="GPU-aaa"} 7.516192768e+10
poold_gpu_memory_used_bytes{gpu="1",uuid="GPU-bbb"} 1.048576e+06
# HELP poold_gpu_processes Compute processes on the GPU.
# TYPE poold_gpu_processes gauge
poold_gpu_processes{gpu="0",uuid="GPU-aaa"} 1
poold_gpu_processes{gpu="1",uuid="GPU-bbb"} 0
# HELP poold_gpu_telemetry_available 1 if the last scrape read GPU telemetry through NVML, 0 if NVML is absent or failed.
# TYPE poold_gpu_telemetry_available gauge
poold_gpu_telemetry_available 1
# HELP poold_gpu_utilization_ratio Fraction of NVML's last sample period during which a kernel ran, per GPU.
# TYPE poold_gpu_utilization_ratio gauge
poold_gpu_utilization_ratio{gpu="0",uuid="GPU-aaa"} 0.93
poold_gpu_utilization_ratio{gpu="1",uuid="GPU-bbb"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "poold_gpu_ecc_errors_total", "poold_gpu_memory_used_bytes", "poold_gpu_processes", "poold_gpu_telemetry_available", "poold_gpu_utilization_ratio"); err != nil {
		t.Fatal(err)
	}

	none := prometheus.NewRegistry()
	none.MustRegister(GPUCollector(gpu.Unavailable{Reason: "libnvidia-ml.so.1 not found"}))
	if n, err := testutil.GatherAndCount(none); err != nil || n != 1 {
		t.Fatalf("without NVML: %d series (%v), want only poold_gpu_telemetry_available", n, err)
	}
}

// Configure creates the per-pool and per-profile counters at zero, so that
// the first event is an increase, and deletes those of a removed pool or
// profile.
func TestConfigureCreatesSeriesAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, func() []statusapi.Pool { return nil }, "v", "r")
	parse := func(s string) *profile.Config {
		t.Helper()
		cfg, err := profile.Parse([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	m.Configure(parse(`{"pools": [{"name": "p0", "gpus": [0]}, {"name": "p1", "gpus": [1]}],
	  "profiles": [{"id": "a", "model": "m"}, {"id": "b", "model": "m", "pools": ["p1"]}]}`))
	series := func() map[string]bool {
		t.Helper()
		got := make(map[string]bool)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				labels := []string{}
				for _, lp := range mt.GetLabel() {
					labels = append(labels, lp.GetName()+"="+lp.GetValue())
				}
				got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = mt.GetCounter().GetValue() == 0
			}
		}
		return got
	}
	got := series()
	for _, want := range []string{
		"poold_engine_starts_total{pool=p0,profile=a,result=failed}",
		"poold_engine_starts_total{pool=p1,profile=b,result=ok}",
		"poold_engine_exits_total{pool=p1,profile=a,reason=crashed}",
		"poold_engine_exits_total{pool=p1,profile=b,reason=load_failed}",
		"poold_engine_exits_total{pool=p0,profile=a,reason=first_request_failed}",
		"poold_vram_not_released_total{pool=p0}",
		"poold_sleep_vram_not_released_total{pool=p1}",
		"poold_engine_metrics_scrape_failures_total{pool=p1}",
		"poold_engine_log_dropped_lines_total{pool=p1,reason=own_poll}",
	} {
		if zero, ok := got[want]; !ok || !zero {
			t.Errorf("%s: present %v, at zero %v", want, ok, zero)
		}
	}
	if _, ok := got["poold_engine_starts_total{pool=p0,profile=b,result=ok}"]; ok {
		t.Error("a series for b on p0, where it may not run")
	}

	// p1 and b go away; a stays on p0.
	m.Configure(parse(`{"pools": [{"name": "p0", "gpus": [0]}], "profiles": [{"id": "a", "model": "m"}]}`))
	got = series()
	for name := range got {
		if strings.Contains(name, "pool=p1") || strings.Contains(name, "profile=b") {
			t.Errorf("%s survived its pool's or profile's removal", name)
		}
	}
	if _, ok := got["poold_engine_starts_total{pool=p0,profile=a,result=ok}"]; !ok {
		t.Error("a kept series was deleted")
	}
}

// The engines' own load is re-exported per pool and profile; a pool without
// a sample, or whose engine looked nothing up in its prefix cache, exports
// no such series.
func TestEngineStatsGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	prof := "qwen"
	New(reg, func() []statusapi.Pool {
		return []statusapi.Pool{
			{Name: "gpu0", State: statusapi.StateReady, Profile: &prof, Engine: &statusapi.Engine{Profile: prof},
				EngineStats: &statusapi.EngineStats{Running: 4, Waiting: 12, KVCacheUsage: 0.96}},
			{Name: "gpu1", State: statusapi.StateStarting},
		}
	}, "v", "r")
	want := `
# HELP poold_engine_kv_cache_usage_ratio Share of the awake engine's KV cache in use, 0 to 1 (vllm:kv_cache_usage_perc).
# TYPE poold_engine_kv_cache_usage_ratio gauge
poold_engine_kv_cache_usage_ratio{pool="gpu0",profile="qwen"} 0.96
# HELP poold_engine_requests_running Requests in the awake engine's running batch, as the engine reports (vllm:num_requests_running).
# TYPE poold_engine_requests_running gauge
poold_engine_requests_running{pool="gpu0",profile="qwen"} 4
# HELP poold_engine_requests_waiting Requests queued inside the awake engine, as the engine reports (vllm:num_requests_waiting).
# TYPE poold_engine_requests_waiting gauge
poold_engine_requests_waiting{pool="gpu0",profile="qwen"} 12
`
	names := []string{"poold_engine_requests_running", "poold_engine_requests_waiting", "poold_engine_kv_cache_usage_ratio", "poold_engine_prefix_cache_hit_ratio"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// Each pool's GPUs are exported, to join the GPU series to the pools.
func TestPoolGPUInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg, func() []statusapi.Pool {
		return []statusapi.Pool{{Name: "gpu0", GPUs: []int{0}, State: statusapi.StateEmpty}, {Name: "gpu12", GPUs: []int{1, 2}, State: statusapi.StateEmpty}}
	}, "v", "r")
	want := `
# HELP poold_pool_gpu_info 1 for each GPU (NVML index) of each pool: joins the GPU series to the pools.
# TYPE poold_pool_gpu_info gauge
poold_pool_gpu_info{gpu="0",pool="gpu0"} 1
poold_pool_gpu_info{gpu="1",pool="gpu12"} 1
poold_pool_gpu_info{gpu="2",pool="gpu12"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "poold_pool_gpu_info"); err != nil {
		t.Error(err)
	}
}
