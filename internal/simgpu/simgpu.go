// Package simgpu simulates GPU memory for machines without a GPU. A directory
// shared by the processes that use it describes the fake GPUs (gpus.json: the
// index and total bytes of each) and holds one claim file per process
// (claims/<pid>.json: the bytes it holds on each GPU). An exclusive flock on
// the directory's lock file makes a check-and-claim atomic across processes.
// A claim whose process is gone (or is a zombie, or is a new process that
// reused the pid) is ignored and removed by the next update, so a process
// killed with SIGKILL frees its memory as it would on a real GPU.
//
// The simulator (`poold engine-sim --sim-gpu-dir DIR`) claims memory here as
// vLLM does on a GPU, and gpu.SimProvider reads it as NVML telemetry.
package simgpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

const (
	gpusFile  = "gpus.json"
	lockFile  = "lock"
	claimsDir = "claims"
)

// GPU is one simulated GPU.
type GPU struct {
	Index      int    `json:"index"`
	TotalBytes uint64 `json:"totalBytes"`
}

// Holder is the memory one process holds on one GPU.
type Holder struct {
	PID   int
	Bytes uint64
}

// Usage is one GPU with the live claims on it, by pid.
type Usage struct {
	GPU
	UsedBytes uint64
	Holders   []Holder
}

// FreeBytes is the memory no live process holds.
func (u Usage) FreeBytes() uint64 { return u.TotalBytes - min(u.UsedBytes, u.TotalBytes) }

// Dir is a simulated-GPU directory. Open it with Open; the zero
// value is not usable. It is safe for concurrent use by goroutines and
// processes.
type Dir struct{ path string }

type gpusDoc struct {
	GPUs []GPU `json:"gpus"`
}

type claimEntry struct {
	Index int    `json:"index"`
	Bytes uint64 `json:"bytes"`
}

// claimDoc is one process's claim; Start is the process's start time (field
// 22 of /proc/<pid>/stat), which tells a live claimant from a reused pid.
type claimDoc struct {
	PID   int          `json:"pid"`
	Start uint64       `json:"start"`
	GPUs  []claimEntry `json:"gpus"`
}

// Open opens the directory at path, which holds gpus.json.
func Open(path string) (*Dir, error) {
	d := &Dir{path: path}
	if _, err := d.gpus(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(path, claimsDir), 0o755); err != nil {
		return nil, fmt.Errorf("opening simulated gpu directory: %w", err)
	}
	return d, nil
}

// Path is the directory's path.
func (d *Dir) Path() string { return d.path }

func validate(gpus []GPU) error {
	if len(gpus) == 0 {
		return errors.New("no gpus")
	}
	seen := make(map[int]bool)
	for _, g := range gpus {
		switch {
		case g.Index < 0:
			return fmt.Errorf("gpu index %d is negative", g.Index)
		case seen[g.Index]:
			return fmt.Errorf("gpu %d listed twice", g.Index)
		case g.TotalBytes == 0:
			return fmt.Errorf("gpu %d has no memory", g.Index)
		}
		seen[g.Index] = true
	}
	return nil
}

func (d *Dir) gpus() ([]GPU, error) {
	b, err := os.ReadFile(filepath.Join(d.path, gpusFile))
	if err != nil {
		return nil, fmt.Errorf("reading simulated gpus: %w", err)
	}
	var doc gpusDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("reading simulated gpus from %s: %w", d.path, err)
	}
	if err := validate(doc.GPUs); err != nil {
		return nil, fmt.Errorf("simulated gpus in %s: %w", d.path, err)
	}
	slices.SortFunc(doc.GPUs, func(a, b GPU) int { return a.Index - b.Index })
	return doc.GPUs, nil
}

// lock takes the directory's flock (exclusive or shared) and returns its
// release.
func (d *Dir) lock(how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(d.path, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the simulated gpu lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the simulated gpus: %w", err)
	}
	return func() { f.Close() }, nil // closing releases the flock
}

// Snapshot reads every GPU, in index order, with the live claims on it.
func (d *Dir) Snapshot() ([]Usage, error) {
	unlock, err := d.lock(syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	use, _, err := d.read(false)
	return use, err
}

// read returns the usage of every GPU and the live claims by pid; with prune
// it removes the claim files of dead processes. The lock must be held.
func (d *Dir) read(prune bool) ([]Usage, map[int]claimDoc, error) {
	gpus, err := d.gpus()
	if err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(filepath.Join(d.path, claimsDir))
	if err != nil {
		return nil, nil, fmt.Errorf("reading simulated gpu claims: %w", err)
	}
	live := make(map[int]claimDoc)
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		pid, err := strconv.Atoi(name)
		if !ok || err != nil {
			continue // a temporary file, or not ours
		}
		file := filepath.Join(d.path, claimsDir, e.Name())
		b, err := os.ReadFile(file)
		var c claimDoc
		if err != nil || json.Unmarshal(b, &c) != nil || c.PID != pid {
			continue
		}
		if start, ok := processStart(pid); !ok || start != c.Start {
			if prune {
				_ = os.Remove(file)
			}
			continue
		}
		live[pid] = c
	}
	use := make([]Usage, len(gpus))
	for i, g := range gpus {
		use[i].GPU = g
	}
	for _, pid := range sortedPIDs(live) {
		for _, e := range live[pid].GPUs {
			if i := slices.IndexFunc(use, func(u Usage) bool { return u.Index == e.Index }); i >= 0 && e.Bytes > 0 {
				use[i].UsedBytes += e.Bytes
				use[i].Holders = append(use[i].Holders, Holder{PID: pid, Bytes: e.Bytes})
			}
		}
	}
	return use, live, nil
}

func sortedPIDs(m map[int]claimDoc) []int {
	pids := make([]int, 0, len(m))
	for pid := range m {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// Update sets pid's claim atomically. Under the exclusive lock it passes the
// usage of every GPU (all live claims, pid's own included) to f and records
// what f returns as pid's whole claim: bytes by GPU index, where an empty map
// removes the claim. An error from f leaves the claim as it was and is
// returned as it is. pid must be a live process.
func (d *Dir) Update(pid int, f func(gpus []Usage) (map[int]uint64, error)) error {
	unlock, err := d.lock(syscall.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	use, _, err := d.read(true)
	if err != nil {
		return err
	}
	want, err := f(use)
	if err != nil {
		return err
	}
	file := filepath.Join(d.path, claimsDir, strconv.Itoa(pid)+".json")
	c := claimDoc{PID: pid}
	for idx, n := range want {
		if !slices.ContainsFunc(use, func(u Usage) bool { return u.Index == idx }) {
			return fmt.Errorf("claiming memory on gpu %d: no such simulated gpu", idx)
		}
		if n > 0 {
			c.GPUs = append(c.GPUs, claimEntry{Index: idx, Bytes: n})
		}
	}
	if len(c.GPUs) == 0 {
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("releasing simulated gpu memory: %w", err)
		}
		return nil
	}
	slices.SortFunc(c.GPUs, func(a, b claimEntry) int { return a.Index - b.Index })
	start, ok := processStart(pid)
	if !ok {
		return fmt.Errorf("claiming simulated gpu memory for pid %d: no such process", pid)
	}
	c.Start = start
	b, _ := json.Marshal(c)
	if err := writeAtomic(file, b); err != nil {
		return fmt.Errorf("claiming simulated gpu memory: %w", err)
	}
	return nil
}

// Release removes pid's claim.
func (d *Dir) Release(pid int) error {
	return d.Update(pid, func([]Usage) (map[int]uint64, error) { return nil, nil })
}

// writeAtomic replaces file with b through a temporary file and a rename.
func writeAtomic(file string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// processStart reads the start time of pid from /proc and reports whether
// pid is a live (not zombie) process.
func processStart(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may contain spaces and parentheses
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:]) // field 3 (state) onwards
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64) // field 22
	return start, err == nil
}
