package simgpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

const gib = 1 << 30

// holder starts a process that lives until the test ends (or kill is
// called) and returns its pid.
func holder(t *testing.T) (pid int, kill func()) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(kill)
	return cmd.Process.Pid, kill
}

func newDir(t *testing.T) *Dir {
	t.Helper()
	d, err := create(t.TempDir(), []GPU{{Index: 1, TotalBytes: 80 * gib}, {Index: 0, TotalBytes: 40 * gib}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func claim(d *Dir, pid int, want map[int]uint64) error {
	return d.Update(pid, func([]Usage) (map[int]uint64, error) { return want, nil })
}

func TestCreateOpenSnapshot(t *testing.T) {
	d := newDir(t)
	o, err := Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	use, err := o.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(use) != 2 || use[0].Index != 0 || use[0].TotalBytes != 40*gib || use[1].Index != 1 || use[0].UsedBytes != 0 || use[1].FreeBytes() != 80*gib {
		t.Fatalf("snapshot %+v", use)
	}
	if _, err := Open(t.TempDir()); err == nil {
		t.Fatal("opened a directory without gpus.json")
	}
	for _, bad := range [][]GPU{nil, {{Index: 0}}, {{Index: 0, TotalBytes: 1}, {Index: 0, TotalBytes: 1}}, {{Index: -1, TotalBytes: 1}}} {
		if _, err := create(t.TempDir(), bad); err == nil {
			t.Errorf("create accepted %+v", bad)
		}
	}
}

func TestClaimsAddUpAndRelease(t *testing.T) {
	d := newDir(t)
	a, _ := holder(t)
	b, _ := holder(t)
	if err := claim(d, a, map[int]uint64{0: 10 * gib, 1: 20 * gib}); err != nil {
		t.Fatal(err)
	}
	if err := claim(d, b, map[int]uint64{1: 30 * gib}); err != nil {
		t.Fatal(err)
	}
	use, _ := d.Snapshot()
	held := map[int]uint64{}
	for _, h := range use[1].Holders {
		held[h.PID] = h.Bytes
	}
	if use[0].UsedBytes != 10*gib || use[1].UsedBytes != 50*gib || len(held) != 2 || held[a] != 20*gib || held[b] != 30*gib {
		t.Fatalf("usage %+v", use)
	}
	// An update replaces the whole claim.
	if err := claim(d, a, map[int]uint64{1: 1 * gib}); err != nil {
		t.Fatal(err)
	}
	use, _ = d.Snapshot()
	if use[0].UsedBytes != 0 || use[1].UsedBytes != 31*gib {
		t.Fatalf("after the update: %+v", use)
	}
	if err := d.Release(a); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(a); err != nil {
		t.Fatalf("second release: %v", err)
	}
	use, _ = d.Snapshot()
	if use[1].UsedBytes != 30*gib || len(use[1].Holders) != 1 || use[1].Holders[0].PID != b {
		t.Fatalf("after the release: %+v", use)
	}
	if err := claim(d, b, map[int]uint64{7: 1}); err == nil {
		t.Fatal("claimed memory on a gpu that does not exist")
	}
}

// A claim whose process died no longer counts, and the next update removes
// its file.
func TestDeadClaimsAreIgnored(t *testing.T) {
	d := newDir(t)
	pid, kill := holder(t)
	if err := claim(d, pid, map[int]uint64{0: 40 * gib}); err != nil {
		t.Fatal(err)
	}
	if use, _ := d.Snapshot(); use[0].FreeBytes() != 0 {
		t.Fatalf("claim not counted: %+v", use)
	}
	kill()
	if use, _ := d.Snapshot(); use[0].FreeBytes() != 40*gib || len(use[0].Holders) != 0 {
		t.Fatalf("a dead process still holds memory: %+v", use)
	}
	other, _ := holder(t)
	if err := claim(d, other, map[int]uint64{0: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Path(), claimsDir, strconv.Itoa(pid)+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dead claim file left after an update: %v", err)
	}
	if err := claim(d, 1<<30, map[int]uint64{0: 1}); err == nil {
		t.Fatal("claimed memory for a pid that does not exist")
	}
}

// Check-and-claim is atomic: of many concurrent claimants that each need 30%
// of a GPU, exactly three get it.
func TestUpdateIsAtomic(t *testing.T) {
	d := newDir(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		pid, _ := holder(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Update(pid, func(use []Usage) (map[int]uint64, error) {
				need := use[0].TotalBytes * 3 / 10
				if use[0].FreeBytes() < need {
					return nil, errFull
				}
				return map[int]uint64{0: need}, nil
			})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errFull):
			t.Fatal(err)
		}
	}
	use, _ := d.Snapshot()
	if ok != 3 || use[0].UsedBytes != 3*(40*gib*3/10) {
		t.Fatalf("%d claims succeeded, usage %+v; want 3", ok, use)
	}
}

var errFull = errors.New("full")

// create makes (or rewrites) the directory at path describing gpus, keeping
// the claims already in it. Outside these tests the directory is written
// by hand: gpus.json (docs/gpu.md) is the interface.
func create(path string, gpus []GPU) (*Dir, error) {
	if err := validate(gpus); err != nil {
		return nil, fmt.Errorf("simulated gpus in %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Join(path, claimsDir), 0o755); err != nil {
		return nil, fmt.Errorf("creating simulated gpu directory: %w", err)
	}
	b, _ := json.MarshalIndent(gpusDoc{GPUs: gpus}, "", "  ")
	if err := writeAtomic(filepath.Join(path, gpusFile), b); err != nil {
		return nil, fmt.Errorf("writing simulated gpus: %w", err)
	}
	return &Dir{path: path}, nil
}
