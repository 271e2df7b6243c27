package engine

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

// engineGroupPrefix begins the name of every engine's cgroup.
const engineGroupPrefix = "engine-"

// Ledger records the engines a poold runs in engines.json under its state
// directory, so that the next poold can stop what a crash left behind (vLLM's
// EngineCore grandchildren survive a SIGKILLed parent and keep the GPUs). It
// holds an exclusive lock on the directory while open, so that two daemons
// never share it. It opens only a directory that nobody but poold's user
// could have written (CheckStateDir), and acts only on the records that check
// out (check). A nil *Ledger records nothing and reaps nothing.
type Ledger struct {
	dir  string // the state directory, symbolic links resolved (CheckStateDir)
	path string
	lock *os.File // holds the flock; closed by Close
	boot string   // this boot's id
	uid  int      // poold's effective uid: the owner of all it acts on
	// base is the delegated cgroup (Containment), links resolved, under
	// which alone a recorded engine group is acted on; "" in process-group
	// mode, where no recorded group is.
	base string
	// stopShim stops a recorded engine through its shim before the reap
	// signals what is left (OpenLedger); nil: none is.
	stopShim func(LedgerEngine, time.Duration, *slog.Logger)
	log      *slog.Logger

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
	// Argv is the engine's command line, and EnvSums a digest of each
	// variable poold gave it on purpose, by name, its value not kept: what
	// an adoption refused for a changed profile compares to say what
	// changed. Both are nil in a ledger of an older poold.
	Argv    []string          `json:"argv,omitempty"`
	EnvSums map[string]string `json:"envSums,omitempty"`
}

// ledgerFile is the JSON shape of engines.json.
type ledgerFile struct {
	BootID  string         `json:"bootId"`
	Engines []LedgerEngine `json:"engines"`
}

// OpenLedger creates dir if needed, checks that it can be trusted
// (CheckStateDir: an error wrapping ErrUntrusted names the path and the
// fix), and locks it for this process. contain is the engines' containment:
// only its delegated cgroup's engine groups are acted on (nil: none).
// stopShim, when not nil, is called by a reap, concurrently, for each
// recorded engine with a shim, to stop it through its shim with the reap's
// grace, logging to the ledger's log, before what it left is signalled
// (ReapEngines).
func OpenLedger(dir string, contain *Containment, stopShim func(rec LedgerEngine, grace time.Duration, log *slog.Logger), log *slog.Logger) (*Ledger, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	uid := os.Geteuid()
	dir, err := CheckStateDir(dir, uid)
	if err != nil {
		return nil, err
	}
	lockPath, path := filepath.Join(dir, "lock"), filepath.Join(dir, "engines.json")
	for _, p := range []string{lockPath, path} {
		if _, err := CheckFile(p, uid); err != nil {
			return nil, err
		}
	}
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening state directory lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("state directory %q is in use by another poold: %w", dir, err)
	}
	var base string
	if contain.Mode() == ModeCgroup {
		base, _ = filepath.EvalSymlinks(contain.base)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return &Ledger{
		dir:      dir,
		path:     path,
		lock:     lock,
		boot:     strings.TrimSpace(string(boot)),
		uid:      uid,
		base:     base,
		stopShim: stopShim,
		log:      log.With("component", "ledger"),
		engines:  make(map[int]LedgerEngine),
	}, nil
}

// Dir is the state directory, symbolic links resolved; "" for a nil
// *Ledger.
func (l *Ledger) Dir() string {
	if l == nil {
		return ""
	}
	return l.dir
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
// previous poold left, before this one records any. It returns only those
// that check out (check); the others are logged and never acted on.
func (l *Ledger) Recorded() ([]LedgerEngine, error) {
	if l == nil || l.boot == "" {
		return nil, nil
	}
	if exists, err := CheckFile(l.path, l.uid); !exists || err != nil {
		return nil, err
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
	var engines []LedgerEngine
	for _, e := range f.Engines {
		checked, err := l.check(e)
		if err != nil {
			l.log.Error("not acting on an engine that the engines file records: it is not one poold could have recorded", "path", l.path, "pool", e.Pool, "profile", e.Profile, "pid", e.PID, "err", err)
			continue
		}
		engines = append(engines, checked)
	}
	return engines, nil
}

// check returns e as poold may act on it, or why it may not: each field
// must be one that poold could have recorded. The engine leads its own
// process group; its leader, while it runs, is a process of poold's user
// (whether it is the recorded process, by its start time, is for the
// adoption and the reaping to tell: they leave another process alone); its
// shim's socket is in the state directory; its cgroup is an engine group
// directly under the delegated cgroup. With no delegated cgroup
// (process-group mode, poold stop-engines) a recorded cgroup is not acted
// on: the engine is found by its process group and token, and the next
// poold in cgroup mode removes the group.
func (l *Ledger) check(e LedgerEngine) (LedgerEngine, error) {
	if e.PID <= 1 || e.PGID != e.PID {
		return e, fmt.Errorf("pid %d with process group %d is not an engine leading its own group", e.PID, e.PGID)
	}
	if real, eff, err := procOwner(e.PID); err == nil && (real != l.uid || eff != l.uid) {
		return e, fmt.Errorf("its process %d runs as uid %d (effective %d), not as poold's user (uid %d)", e.PID, real, eff, l.uid)
	}
	if e.Shim != "" {
		if err := l.checkShim(e.Shim); err != nil {
			return e, err
		}
	}
	switch {
	case e.Cgroup == "":
	case l.base == "":
		l.log.Warn("not acting on a recorded engine's cgroup: there is no delegated cgroup here; the engine is stopped by its process group and token", "pool", e.Pool, "pid", e.PID, "cgroup", e.Cgroup)
		e.Cgroup = ""
	default:
		if err := checkEngineGroup(e.Cgroup, l.base); err != nil {
			return e, err
		}
	}
	return e, nil
}

// checkShim refuses path unless it is a shim's socket directly in the state
// directory, as poold names them (engine-….sock), and, where it and its log
// exist, they are poold's user's and no symbolic links.
func (l *Ledger) checkShim(path string) error {
	name := filepath.Base(path)
	if filepath.Clean(path) != path || filepath.Dir(path) != l.dir || !strings.HasPrefix(name, "engine-") || !strings.HasSuffix(name, ".sock") {
		return fmt.Errorf("its supervisor's socket %s is not one in the state directory %s", path, l.dir)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("its supervisor's socket %s is not a socket (%s)", path, fi.Mode().Type())
	}
	for _, p := range []string{path, path + ".log"} {
		if _, err := CheckFile(p, l.uid); err != nil {
			return err
		}
	}
	return nil
}

// checkEngineGroup refuses dir unless it is an engine group directly under
// base, the delegated cgroup, symbolic links resolved: no other directory
// is ever emptied (cgroup.kill) or removed as an engine's group. A group
// that does not exist is no error: there is nothing in it to act on.
func checkEngineGroup(dir, base string) error {
	if filepath.Clean(dir) != dir || filepath.Dir(dir) != base || !strings.HasPrefix(filepath.Base(dir), engineGroupPrefix) {
		return fmt.Errorf("its cgroup %s is not an engine group under poold's delegated cgroup %s", dir, base)
	}
	real, err := filepath.EvalSymlinks(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("its cgroup %s: %w", dir, err)
	case real != dir:
		return fmt.Errorf("its cgroup %s leads to %s, outside poold's delegated cgroup %s", dir, real, base)
	}
	return nil
}

// ownedBy returns the pids of processes whose real and effective uid is uid.
func ownedBy(pids []int, uid int) []int {
	var owned []int
	for _, pid := range pids {
		if real, eff, err := procOwner(pid); err == nil && real == uid && eff == uid {
			owned = append(owned, pid)
		}
	}
	return owned
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

// ReapEngines stops every process that the recorded engines (of this boot,
// as Recorded returns them: checked) left behind: SIGTERM, up to grace for
// them to go, then SIGKILL. A process counts only if it is still that
// engine's: in the engine's recorded cgroup (cgroup mode, which is then
// removed), or else (process-group mode) as leftovers finds it, and a
// process of poold's user: started no earlier than the engine, and in its
// process group, or carrying its token, or descending from such a process. An
// engine with a shim is given to the ledger's stopShim first (OpenLedger):
// only what is left once it returned is signalled. ReapEngines returns
// the processes it stopped, or an error naming those that survived SIGKILL.
// It then rewrites the file with the engines recorded by this poold alone.
func (l *Ledger) ReapEngines(engines []LedgerEngine, grace time.Duration) ([]int, error) {
	if l == nil {
		return nil, nil
	}
	var pids, loose []int // every process found; those of process-group mode
	var wg sync.WaitGroup
	for _, e := range engines {
		if e.Shim == "" {
			continue
		}
		if e.Cgroup != "" {
			pids = append(pids, cgroupProcs(e.Cgroup)...)
		} else {
			pids = append(pids, ownedBy(leftovers(e), l.uid)...)
		}
		if l.stopShim != nil {
			wg.Go(func() { l.stopShim(e, grace, l.log) })
		}
	}
	wg.Wait()
	var groups []string
	for _, e := range engines {
		var left []int
		if e.Cgroup != "" {
			left = cgroupProcs(e.Cgroup)
			groups = append(groups, e.Cgroup)
		} else {
			left = ownedBy(leftovers(e), l.uid)
			loose = append(loose, left...)
		}
		if len(left) > 0 {
			l.log.Warn("stopping an engine left by a previous poold", "pool", e.Pool, "profile", e.Profile, "pgid", e.PGID, "cgroup", e.Cgroup, "port", e.Port, "pids", left)
		}
		for _, pid := range left {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
		RemoveShimFiles(e.Shim)
	}
	for _, dir := range groups {
		if err := CgroupTree(dir, 0).End(grace, nil, l.log); err != nil {
			return pids, fmt.Errorf("leftover engine processes: %w", err)
		}
		if err := RemoveCgroup(dir); err != nil {
			l.log.Warn("removing a leftover engine's cgroup", "cgroup", dir, "err", err)
		}
	}
	if len(loose) > 0 {
		signalAll(loose, syscall.SIGTERM)
		if !waitGone(loose, grace) {
			signalAll(loose, syscall.SIGKILL)
			if !waitGone(loose, KillWait) {
				return pids, fmt.Errorf("leftover engine processes %v survived SIGKILL", liveOf(loose))
			}
		}
	}
	return pids, l.write()
}

// Add records e, an engine started (or adopted), and rewrites the file.
func (l *Ledger) Add(e LedgerEngine) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.engines[e.PGID] = e
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine", "pid", e.PID, "err", err)
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

// Asleep records that the engine leading process group pgid sleeps at
// level, or (0) is awake; an engine not recorded is left so.
func (l *Ledger) Asleep(pgid, level int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.engines[pgid]
	if !ok {
		return
	}
	r.Sleeping = level
	l.engines[pgid] = r
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine sleep", "pid", pgid, "err", err)
	}
}

// Remove forgets the engine leading process group pgid, whose processes are
// gone, and removes the files of its shim, shim (RemoveShimFiles; "": none).
func (l *Ledger) Remove(pgid int, shim string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.engines, pgid)
	RemoveShimFiles(shim)
	if err := l.writeLocked(); err != nil {
		l.log.Warn("recording engine stop", "pid", pgid, "err", err)
	}
}

// RemoveShimFiles removes the socket at path and the log beside it of a shim
// whose engine is gone; "" is none.
func RemoveShimFiles(path string) {
	if path != "" {
		_ = os.Remove(path)
		_ = os.Remove(path + ".log")
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

// Stat is the part of /proc/PID/stat poold reads (ProcStat).
type Stat struct {
	State byte   // R, S, D, Z (a zombie), X (dead)…
	PPID  int    // the parent
	PGID  int    // the process group
	Start uint64 // the start time, in clock ticks after boot
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
		time.Sleep(PollInterval(time.Since(start), time.Millisecond, 50*time.Millisecond))
	}
	return true
}
