package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tokenEnv names the environment variable that marks an engine's processes.
const tokenEnv = "POOLD_ENGINE_TOKEN"

// Ledger records the engines a poold runs in engines.json under its state
// directory, so that the next poold can stop what a crash left behind (vLLM's
// EngineCore grandchildren survive a SIGKILLed parent and keep the GPUs). It
// holds an exclusive lock on the directory while open, so that two daemons
// never share it. A nil *Ledger records nothing.
type Ledger struct {
	path string
	lock *os.File // holds the flock; closed by Close
	boot string   // this boot's id
	log  *slog.Logger

	mu      sync.Mutex           // guards engines and writes of the file
	engines map[int]LedgerEngine // by process group id
}

// LedgerEngine is one recorded engine.
type LedgerEngine struct {
	Pool    string `json:"pool"`
	Profile string `json:"profile"`
	PID     int    `json:"pid"`
	PGID    int    `json:"pgid"`
	Port    int    `json:"port"`
	// StartTicks is the leader's start time in clock ticks after boot; every
	// process of the engine started at or after it.
	StartTicks uint64 `json:"startTicks"`
	// Token is the engine's POOLD_ENGINE_TOKEN, inherited by its descendants.
	Token string `json:"token"`
	// Cgroup is the directory of the engine's own cgroup (cgroup mode):
	// every process left in it is the engine's. Empty in process-group mode.
	Cgroup string `json:"cgroup,omitempty"`
	// Shim is the socket of the engine's supervisor (`poold engine-shim`),
	// through which the next poold adopts it; empty for an engine started
	// as poold's own child, which dies with it.
	Shim string `json:"shim,omitempty"`
	// Sleeping is the sleep level of an engine put to sleep; 0 when awake.
	Sleeping int `json:"sleeping,omitempty"`
}

// ledgerFile is the JSON shape of engines.json.
type ledgerFile struct {
	BootID  string         `json:"bootId"`
	Engines []LedgerEngine `json:"engines"`
}

// OpenLedger creates dir if needed and locks it for this process.
func OpenLedger(dir string, log *slog.Logger) (*Ledger, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening state directory lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("state directory %q is in use by another poold: %w", dir, err)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return &Ledger{
		path:    filepath.Join(dir, "engines.json"),
		lock:    lock,
		boot:    strings.TrimSpace(string(boot)),
		log:     log.With("component", "ledger"),
		engines: make(map[int]LedgerEngine),
	}, nil
}

// Close releases the directory's lock. The file is left as it is: after a
// clean shutdown it lists no engine.
func (l *Ledger) Close() error {
	if l == nil {
		return nil
	}
	return l.lock.Close()
}

// Recorded returns the engines that the file records on this boot: those a
// previous poold left, before this one records any.
func (l *Ledger) Recorded() ([]LedgerEngine, error) {
	if l == nil {
		return nil, nil
	}
	data, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", l.path, err)
	}
	var f ledgerFile
	if err := json.Unmarshal(data, &f); err != nil {
		l.log.Warn("ignoring an unreadable engines file", "path", l.path, "err", err)
		return nil, nil
	}
	if f.BootID != l.boot {
		return nil, nil
	}
	return f.Engines, nil
}

// Reap stops every process that an engine of a previous run, recorded in the
// file, left behind (ReapEngines of what Recorded returns).
func (l *Ledger) Reap(grace time.Duration) ([]int, error) {
	recorded, err := l.Recorded()
	if err != nil {
		return nil, err
	}
	return l.ReapEngines(recorded, grace)
}

// ReapEngines stops every process that the recorded engines (of this boot)
// left behind: SIGTERM, up to grace for them to go, then SIGKILL. A process
// counts only if it is still that engine's: in the engine's recorded cgroup
// (cgroup mode, which is then removed), or else (process-group mode) as
// leftovers finds it: started no earlier than the engine, and in its process
// group, or carrying its token, or descending from such a process. An
// engine's shim ends with it. ReapEngines returns the processes it stopped,
// or an error naming those that survived SIGKILL. It then rewrites the file
// with the engines recorded by this poold alone.
func (l *Ledger) ReapEngines(engines []LedgerEngine, grace time.Duration) ([]int, error) {
	if l == nil {
		return nil, nil
	}
	var pids, loose []int // every process found; those of process-group mode
	var groups []string
	for _, e := range engines {
		var left []int
		if e.Cgroup != "" {
			left = cgroupProcs(e.Cgroup)
			groups = append(groups, e.Cgroup)
		} else {
			left = leftovers(e)
			loose = append(loose, left...)
		}
		if len(left) > 0 {
			l.log.Warn("stopping an engine left by a previous poold", "pool", e.Pool, "profile", e.Profile, "pgid", e.PGID, "cgroup", e.Cgroup, "port", e.Port, "pids", left)
		}
		pids = append(pids, left...)
		removeShimFiles(e.Shim)
	}
	for _, dir := range groups {
		if err := cgroupTree(dir).end(grace, nil, l.log); err != nil {
			return pids, fmt.Errorf("leftover engine processes: %w", err)
		}
		if err := removeCgroup(dir); err != nil {
			l.log.Warn("removing a leftover engine's cgroup", "cgroup", dir, "err", err)
		}
	}
	if len(loose) > 0 {
		signalAll(loose, syscall.SIGTERM)
		if !waitGone(loose, grace) {
			signalAll(loose, syscall.SIGKILL)
			if !waitGone(loose, killWait) {
				return pids, fmt.Errorf("leftover engine processes %v survived SIGKILL", liveOf(loose))
			}
		}
	}
	return pids, l.write()
}

// add records e, which runs on pool.
func (l *Ledger) add(pool string, e *engine) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.engines[e.pid] = LedgerEngine{Pool: pool, Profile: e.profile.ID, PID: e.pid, PGID: e.pid, Port: e.port, StartTicks: e.startTicks, Token: e.token, Cgroup: e.cgroup, Shim: e.shimPath}
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine", "pid", e.pid, "err", err)
	}
}

// Cgroups returns the cgroups of the engines recorded now (cgroup mode).
func (l *Ledger) Cgroups() map[string]bool {
	groups := make(map[string]bool)
	if l == nil {
		return groups
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.engines {
		if e.Cgroup != "" {
			groups[e.Cgroup] = true
		}
	}
	return groups
}

// asleep records that e sleeps at level, or (0) is awake.
func (l *Ledger) asleep(e *engine, level int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.engines[e.pid]
	if !ok {
		return
	}
	r.Sleeping = level
	l.engines[e.pid] = r
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine sleep", "pid", e.pid, "err", err)
	}
}

// remove forgets e, whose process group is gone.
func (l *Ledger) remove(e *engine) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.engines, e.pid)
	removeShimFiles(e.shimPath)
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine stop", "pid", e.pid, "err", err)
	}
}

func (l *Ledger) write() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeLocked()
}

// writeLocked replaces the file atomically (temporary file, fsync, rename).
func (l *Ledger) writeLocked() error {
	f := ledgerFile{BootID: l.boot, Engines: []LedgerEngine{}}
	for _, pgid := range slices.Sorted(maps.Keys(l.engines)) {
		f.Engines = append(f.Engines, l.engines[pgid])
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(l.path), ".engines-*.json")
	if err != nil {
		return fmt.Errorf("writing engines file: %w", err)
	}
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), l.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing engines file: %w", err)
	}
	return nil
}

// stat is the part of /proc/PID/stat poold reads.
type stat struct {
	state byte
	ppid  int
	pgid  int
	start uint64 // clock ticks after boot
}

func signalAll(pids []int, sig syscall.Signal) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
}

// waitGone polls until none of pids is live, or d passes.
func waitGone(pids []int, d time.Duration) bool {
	start := time.Now()
	for len(liveOf(pids)) > 0 {
		if time.Since(start) > d {
			return false
		}
		time.Sleep(pollInterval(time.Since(start), time.Millisecond, 50*time.Millisecond))
	}
	return true
}
