package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/poold/poold/internal/simgpu"
)

func TestSimProvider(t *testing.T) {
	dir := t.TempDir()
	// Two GPUs of 80 GiB.
	if err := os.WriteFile(filepath.Join(dir, "gpus.json"), []byte(`{"gpus": [{"index": 0, "totalBytes": 85899345920}, {"index": 1, "totalBytes": 85899345920}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := simgpu.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	engine := cmd.Process.Pid
	if err := d.Update(engine, func([]simgpu.Usage) (map[int]uint64, error) { return map[int]uint64{1: 72 * gib}, nil }); err != nil {
		t.Fatal(err)
	}
	p, err := OpenSim(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ok, reason := p.Available(); !ok {
		t.Fatalf("unavailable: %s", reason)
	}
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].MemoryUsedBytes != 0 || len(devs[0].Processes) != 0 ||
		devs[1].Index != 1 || devs[1].MemoryUsedBytes != 72*gib || devs[1].MemoryTotalBytes != 80*gib ||
		len(devs[1].Processes) != 1 || devs[1].Processes[0] != (Process{PID: engine, UsedBytes: 72 * gib}) {
		t.Fatalf("devices %+v", devs)
	}
	if sel, err := (&Releaser{Provider: p}).GPUs([]int{1}); err != nil || len(sel) != 1 || sel[0].MemoryUsedBytes != 72*gib {
		t.Fatalf("GPUs: %+v, %v", sel, err)
	}

	// The release check of a stopped engine passes once its process is gone.
	check := (&Releaser{Provider: p, Timeout: 30 * time.Second}).Watch([]int{1}, []int{engine})
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := check(); err != nil {
		t.Fatalf("release check: %v", err)
	}

	if err := os.Remove(dir + "/gpus.json"); err != nil {
		t.Fatal(err)
	}
	if ok, reason := p.Available(); ok || reason == "" {
		t.Fatalf("available without gpus.json (%q)", reason)
	}
	if _, err := OpenSim(t.TempDir()); err == nil {
		t.Fatal("opened an empty directory")
	}
}
