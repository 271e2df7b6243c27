package enginesim

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/poold/poold/internal/simgpu"
)

// holdGPU starts a process that claims bytes on gpu and returns a function
// that kills it.
func holdGPU(t *testing.T, d *simgpu.Dir, gpu int, bytes uint64) (kill func()) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	t.Cleanup(kill)
	if err := d.Update(cmd.Process.Pid, func([]simgpu.Usage) (map[int]uint64, error) { return map[int]uint64{gpu: bytes}, nil }); err != nil {
		t.Fatal(err)
	}
	return kill
}

func used(t *testing.T, d *simgpu.Dir, gpu int) float64 {
	t.Helper()
	use, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range use {
		if u.Index == gpu {
			return float64(u.UsedBytes) / gib
		}
	}
	t.Fatalf("no gpu %d", gpu)
	return 0
}

func newGPUDir(t *testing.T) *simgpu.Dir {
	t.Helper()
	dir := t.TempDir()
	// Two GPUs of 80 GiB.
	if err := os.WriteFile(filepath.Join(dir, "gpus.json"), []byte(`{"gpus": [{"index": 0, "totalBytes": 85899345920}, {"index": 1, "totalBytes": 85899345920}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := simgpu.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// vLLM's start-up rule: free memory on each GPU must be at least total ×
// --gpu-memory-utilization; then the engine holds that much. Asleep it keeps
// a residue; a wake reclaims, weights and KV cache each half of the rest, and
// fails as an out-of-memory error when the memory is taken.
func TestGPUMemoryRule(t *testing.T) {
	d := newGPUDir(t)
	holdGPU(t, d, 0, 20*gib)
	cfg, err := ParseFlags([]string{"/models/x", "--served-model-name", "m1", "--enable-sleep-mode", "--sim-gpu-dir", d.Path(), "--sim-sleep-residue-mib", "512"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.DevMode = true
	_, err = claimGPUs(cfg, os.Getpid())
	want := "ValueError: Free memory on device cuda:0 (60.00/80.00 GiB) on startup is less than desired GPU memory utilization (0.9, 72.00 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
	if !errors.Is(err, ErrGPUMemory) || err.Error() != want {
		t.Fatalf("start beside 20 GiB held: %v\nwant %s", err, want)
	}
	if u := used(t, d, 0); u != 20 {
		t.Fatalf("a failed start claimed memory: %v GiB used", u)
	}
	cfg.GPUMemoryUtilization = 0.5
	mem, err := claimGPUs(cfg, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.release() })
	if u := used(t, d, 0); u != 60 {
		t.Fatalf("after the start: %v GiB used, want 60", u)
	}
	s := NewHandler(cfg, nil)
	s.mem = mem
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)

	post(t, ts.URL+"/sleep?level=2", "", http.StatusOK)
	if u := used(t, d, 0); u != 20.5 {
		t.Fatalf("asleep: %v GiB used, want 20.5 (the residue)", u)
	}
	other := holdGPU(t, d, 0, 50*gib)
	b := post(t, ts.URL+"/wake_up?tags=weights", "", http.StatusInternalServerError)
	if !strings.Contains(string(b), "CUDA out of memory. Tried to allocate 19.75 GiB. GPU 0 has a total capacity of 80.00 GiB of which 9.50 GiB is free.") {
		t.Fatalf("wake without room: %s", b)
	}
	if !isSleeping(t, ts.URL) || used(t, d, 0) != 70.5 {
		t.Fatalf("a failed wake changed the engine: asleep %v, %v GiB used", isSleeping(t, ts.URL), used(t, d, 0))
	}
	other()
	post(t, ts.URL+"/wake_up?tags=weights", "", http.StatusOK)
	if u := used(t, d, 0); u != 40.25 {
		t.Fatalf("weights awake: %v GiB used, want 40.25", u)
	}
	post(t, ts.URL+"/collective_rpc", `{"method":"reload_weights"}`, http.StatusOK)
	post(t, ts.URL+"/wake_up?tags=kv_cache", "", http.StatusOK)
	if u := used(t, d, 0); u != 60 {
		t.Fatalf("awake: %v GiB used, want 60", u)
	}
	if err := mem.release(); err != nil {
		t.Fatal(err)
	}
	if u := used(t, d, 0); u != 20 {
		t.Fatalf("released: %v GiB used, want 20", u)
	}
}

// Engines on the same simulated GPUs: a second engine on a full GPU exits 1
// with vLLM's message, one on another GPU (CUDA_VISIBLE_DEVICES) starts, and
// an engine that exits releases its memory.
func TestProcessGPUMemory(t *testing.T) {
	t.Parallel()
	d := newGPUDir(t)
	a := startSim(t, "m", "--port", "0", "--sim-gpu-dir", d.Path())
	a.port(t)
	if u := used(t, d, 0); u != 72 {
		t.Fatalf("gpu 0 after the first start: %v GiB used, want 72", u)
	}
	b := startSim(t, "m", "--port", "0", "--sim-gpu-dir", d.Path())
	if st := b.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 {
		t.Fatalf("second engine on gpu 0: %v, want exit 1", st)
	}
	if !hasLine(b.log(), "ValueError: Free memory on device cuda:0 (8.00/80.00 GiB) on startup is less than desired GPU memory utilization (0.9, 72.00 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.") {
		t.Fatalf("second engine's output lacks vLLM's message:\n%s", b.log())
	}
	c := startSimEnv(t, []string{"CUDA_VISIBLE_DEVICES=1"}, "m", "--port", "0", "--sim-gpu-dir", d.Path(), "--gpu-memory-utilization", "0.5")
	c.port(t)
	if u := used(t, d, 1); u != 40 {
		t.Fatalf("gpu 1: %v GiB used, want 40", u)
	}
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if st := a.wait(t, 10*time.Second); !st.Exited() || st.ExitStatus() != 0 {
		t.Fatalf("first engine after SIGTERM: %v", st)
	}
	if u := used(t, d, 0); u != 0 {
		t.Fatalf("gpu 0 after the first engine exited: %v GiB used", u)
	}
	// A SIGKILLed engine's claim no longer counts.
	if err := syscall.Kill(c.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.wait(t, 10*time.Second)
	if u := used(t, d, 1); u != 0 {
		t.Fatalf("gpu 1 after the engine was killed: %v GiB used", u)
	}
	bad := startSimEnv(t, []string{"CUDA_VISIBLE_DEVICES=5"}, "m", "--port", "0", "--sim-gpu-dir", d.Path())
	if st := bad.wait(t, 20*time.Second); !st.Exited() || st.ExitStatus() != 1 || !strings.Contains(bad.log(), "invalid device ordinal") {
		t.Fatalf("engine on a missing gpu: %v\n%s", st, bad.log())
	}
}

// With --sim-spawn-child the EngineCore child holds the memory, and keeps it
// when the API server exits, as a surviving vLLM core does.
func TestProcessChildHoldsGPUMemory(t *testing.T) {
	t.Parallel()
	d := newGPUDir(t)
	p := startSim(t, "m", "--port", "0", "--sim-gpu-dir", d.Path(), "--sim-spawn-child", "--sim-child-lifetime", "2m")
	p.port(t)
	use, _ := d.Snapshot()
	if len(use[0].Holders) != 1 || use[0].Holders[0].PID == p.cmd.Process.Pid {
		t.Fatalf("holders %+v: want the child, not the server (%d)", use[0].Holders, p.cmd.Process.Pid)
	}
	child := use[0].Holders[0].PID
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	if u := used(t, d, 0); u != 72 || !alive(child) {
		t.Fatalf("after the server exited: %v GiB used, child alive %v", u, alive(child))
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("child %d to die", child), func() bool { return !alive(child) })
	if u := used(t, d, 0); u != 0 {
		t.Fatalf("after the child died: %v GiB used", u)
	}
}
