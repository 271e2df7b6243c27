package pool

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/shim"
	"github.com/poold/poold/internal/statusapi"
)

// logLines is how many of an engine's last output lines are kept for error reports.
const logLines = 30

// engine is one engine subprocess in its own process group. Its fields are set
// before start returns and not changed afterwards, except through the exited
// channel (closed by the one goroutine that calls cmd.Wait, after setting
// exitErr), unwatch (the run loop's alone), and the log ring, noted and the
// other atomics (safe for concurrent use).
type engine struct {
	profile   *profile.Profile
	port      int
	gpus      []int    // the pool's GPUs when it started: a reload may move the pool, not the engine
	target    *url.URL // http://127.0.0.1:port, shared read-only by every lease
	pid       int      // also the process group id
	startedAt time.Time
	argv, env []string // the command line and the environment (engineEnv), but the token
	// given is the part of env that poold gives on purpose (givenEnv): with
	// argv, what the engine's fingerprint covers.
	given []string
	// token is POOLD_ENGINE_TOKEN in the environment of the engine and its
	// descendants, which tells them from unrelated processes after a crash.
	token string
	// startTicks is the leader's start time (proc.Stat.Start); 0 if unknown.
	startTicks uint64
	// cgroup is the directory of the engine's own cgroup in cgroup mode
	// (proc.Containment); "" in process-group mode.
	cgroup string
	// shimPath is the socket of the engine's supervisor and conn poold's
	// attachment to it (shimmed.go); "" and nil for an engine that is
	// poold's own child. detached is set once poold let go of it for the
	// next poold to adopt.
	shimPath string
	conn     *shim.Conn
	detached atomic.Bool
	// lost is set once the connection to the shim ended without its
	// report of the exit.
	lost atomic.Bool

	http clients // its probe and control clients
	// idle is how long a connection to it may stay idle (idleTimeout).
	idle time.Duration
	// hurry, once closed, cuts the SIGTERM grace of a stop short (a second
	// signal at shutdown); nil never is.
	hurry <-chan struct{}

	exited  chan struct{}
	exitErr error         // valid once exited is closed
	pumped  chan struct{} // closed once every writer closed the log pipe
	logs    *proc.Output
	// noted has a bit set for each kind of output line (noteLines) the log
	// pump has seen.
	noted atomic.Uint32
	// reason is the last line of output that read as what went wrong
	// (noteReason), from the exception's name on; nil while none did.
	reason atomic.Pointer[string]
	// served is set once the engine is ready (or adopted): only a start
	// acts on the kinds of line noted, so the pump stops scanning its
	// lines then (an engine logs a line per request).
	served atomic.Bool
	// leased is set once a request got a lease on the engine, answered
	// once one succeeded on it (Lease.Succeeded): one that fails leased
	// but never answered died at its first request(s) (diedAtFirst).
	leased, answered atomic.Bool
	// unwakeable is set once the engine said it sleeps by itself and
	// served no sleep endpoints to wake it with (selfsleep.go): that is
	// reported once.
	unwakeable atomic.Bool
	// unwatch ends the /health poller; nil while none runs. Only the
	// pool's run loop uses it.
	unwatch context.CancelFunc
}

// newEngine is the engine of prof on the pool spec, as launch runs it on
// port, marked with token, before it has a process: its pid, startTicks,
// cgroup, shimPath and conn are the caller's to set, and run starts
// following it. hc are the clients of poold's calls to it; hurry, once
// closed, cuts its stop's grace short (nil: never).
func newEngine(prof *profile.Profile, spec *profile.PoolSpec, launch profile.Launch, port int, token string, hc clients, hurry <-chan struct{}) *engine {
	env := engineEnv(prof, spec)
	return &engine{
		profile:   prof,
		port:      port,
		gpus:      slices.Clone(spec.GPUs),
		target:    loopbackURL(port),
		startedAt: time.Now(),
		argv:      prof.Argv(port, spec, launch),
		env:       env,
		given:     givenEnv(prof, spec),
		token:     token,
		http:      hc,
		idle:      idleTimeout(env),
		hurry:     hurry,
		exited:    make(chan struct{}),
		pumped:    make(chan struct{}),
		logs:      proc.NewOutput(logLines),
	}
}

// engineStart is what startEngine starts an engine from. Launch is how:
// poold's own executable (substituted for {poold} in commands, and the
// shim) and the launcher of profiles without a command. Spawn starts its
// process (nil: on the calling thread); Containment in cgroup mode puts it
// in a cgroup of its own (nil: process-group mode); Shims, when set, starts
// it under a supervisor of its own (shimmed.go), else it is poold's own
// child. HTTP are the clients of poold's calls to it; Hurry, once closed,
// cuts its stop's grace short (nil: never); Output is where its output
// lines, and poold's about it, are logged.
type engineStart struct {
	Profile     *profile.Profile
	Spec        *profile.PoolSpec
	Launch      profile.Launch
	Spawn       proc.Spawner
	Containment *proc.Containment
	Shims       *Shims
	HTTP        clients
	Hurry       <-chan struct{}
	Output      outputLog
}

// startEngine starts the engine that o describes on a free loopback port.
func startEngine(o engineStart) (*engine, error) {
	prof, spec, shims := o.Profile, o.Spec, o.Shims
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("choosing a port: %w", err)
	}
	e := newEngine(prof, spec, o.Launch, port, rand.Text(), o.HTTP, o.Hurry)
	argv := e.argv
	var cgroupFD *os.File
	if e.cgroup, cgroupFD, err = o.Containment.NewEngineGroup(spec.Name, e.token); err != nil {
		return nil, err
	}
	if cgroupFD != nil {
		defer cgroupFD.Close()
	}
	var cmd *exec.Cmd
	if shims == nil {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(slices.Clip(e.env), proc.TokenEnv+"="+e.token)
		if cmd.SysProcAttr, err = proc.ProcAttr(); err != nil {
			if e.cgroup != "" {
				_ = proc.RemoveCgroup(e.cgroup)
			}
			return nil, err
		}
		if cgroupFD != nil {
			proc.UseCgroup(cmd.SysProcAttr, cgroupFD)
		}
	} else {
		// The shim starts the engine into its cgroup and stays out of it:
		// a stop that ends the group never ends the shim.
		e.shimPath = shims.socket(e.token)
		cmd = shims.command(o.Launch.Self, e.shimPath, e.token, shim.Fingerprint(argv, e.given), e.cgroup, prof.StopTimeout.Duration, argv)
		cmd.Env = e.env
	}
	var out io.ReadCloser
	var wait func() error
	if shims == nil {
		out, wait, err = proc.StartChild(cmd, o.Spawn)
		if err == nil {
			e.pid = cmd.Process.Pid
		}
	} else if e.conn, err = shims.start(cmd, e.shimPath, o.Spawn); err == nil {
		e.pid = e.conn.Hello.PID
		out, wait = e.follow(o.Output.log.With("profile", prof.ID, "pid", e.pid))
	}
	if err != nil {
		if e.cgroup != "" {
			_ = proc.RemoveCgroup(e.cgroup)
		}
		proc.RemoveShimFiles(e.shimPath)
		return nil, fmt.Errorf("running %q: %w", argv[0], err)
	}
	if st, err := proc.ProcStat(e.pid); err == nil {
		e.startTicks = st.Start
	}
	output := o.Output.with("profile", prof.ID, "pid", e.pid)
	output.log.Info("engine started", "port", port, "argv", strings.Join(argv, " "), "cgroup", e.cgroup, "shim", e.shimPath)
	e.run(out, wait, output)
	return e, nil
}

// run reads the engine's output from r into output and records its exit,
// which wait waits for.
func (e *engine) run(r io.ReadCloser, wait func() error, output outputLog) {
	go e.pump(r, output)
	go func() {
		e.exitErr = wait()
		close(e.exited)
	}()
}

// runs reports whether e runs prof on spec as launch would start it now:
// the same command line and environment.
func (e *engine) runs(prof *profile.Profile, spec *profile.PoolSpec, launch profile.Launch) bool {
	return slices.Equal(e.argv, prof.Argv(e.port, spec, launch)) && slices.Equal(e.env, engineEnv(prof, spec))
}

// engineEnv is the environment prof's engine starts with on spec, but its
// token: what it inherits of poold's environment, then what the profile sets.
func engineEnv(prof *profile.Profile, spec *profile.PoolSpec) []string {
	return append(prof.Inherited(os.Environ()), prof.Environ(spec)...)
}

// givenEnv is the part of engineEnv that poold gives prof's engine on
// purpose: the variables prof's PassEnv names, then those it sets. An
// engine's fingerprint covers these and not what it inherits by family
// (PATH, SHELL, XDG_*…), so that a poold started from another shell, or
// from make, still adopts it.
func givenEnv(prof *profile.Profile, spec *profile.PoolSpec) []string {
	var env []string
	for _, kv := range prof.Inherited(os.Environ()) {
		if k, _, _ := strings.Cut(kv, "="); slices.Contains(prof.PassEnv, k) {
			env = append(env, kv)
		}
	}
	return append(env, prof.Environ(spec)...)
}

// base is the engine's loopback URL.
func (e *engine) base() string { return "http://127.0.0.1:" + strconv.Itoa(e.port) }

// loopbackURL is the base URL of an engine listening on port.
func loopbackURL(port int) *url.URL {
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}
}

// outputWait bounds the wait for an exited engine's last output lines: a
// descendant that survives it may hold the pipe open.
const outputWait = time.Second

// awaitOutput waits, once the engine has exited, until its output has been
// read to the end (every writer closed the pipe), or outputWait passes: the
// pipe is read asynchronously, and the last lines say why it exited.
func (e *engine) awaitOutput() {
	select {
	case <-e.exited:
	default:
		return
	}
	t := time.NewTimer(outputWait)
	defer t.Stop()
	select {
	case <-e.pumped:
	case <-t.C:
	}
}

// failure describes an engine exit with its status (failedWith). It waits
// (bounded) for its last lines: don't call it with the pool's mutex held.
func (e *engine) failure() error {
	e.awaitOutput()
	status := "exited"
	if e.exitErr != nil {
		status = e.exitErr.Error()
	}
	return e.failedWith(status)
}

// failedWith is the error of the engine, failed as what says, with its
// reason and last output lines (lastOutput); one that took requests and
// answered none says that it died at its first.
func (e *engine) failedWith(what string) error {
	if e.diedAtFirst() {
		what = "died at its first request, before any succeeded: " + what
	}
	return fmt.Errorf("engine %q %s; %s", e.profile.ID, what, e.lastOutput())
}

// diedAtFirst reports whether the engine took requests and none succeeded
// on it: failed, it served nothing, however long it was ready.
func (e *engine) diedAtFirst() bool { return e.leased.Load() && !e.answered.Load() }

// failedServing is the failure of the engine, which failed while serving
// with err: ExitFirstRequest when it died at its first request(s), else
// ExitCrashed, with the reason it gave.
func (e *engine) failedServing(err error) failure {
	f := failure{err: err, exit: statusapi.ExitCrashed, reason: e.said()}
	if e.diedAtFirst() {
		f.exit = statusapi.ExitFirstRequest
	}
	return f
}

// stop ends all of the engine's processes (its cgroup, or its process group
// and what left it: see proc.Containment): SIGTERM, up to grace for them to end,
// then SIGKILL. An engine under a shim is stopped by its shim
// (stopShimmed); poold ends itself only what is left once the shim reported
// the exit or is gone, or when the shim failed to stop it. It returns only
// when no live process of the engine remains, or with an error naming the
// survivors. In cgroup mode the group is then removed.
func (e *engine) stop(grace time.Duration, log *slog.Logger) error {
	log = log.With("profile", e.profile.ID, "pid", e.pid)
	if e.conn != nil {
		if err := e.stopShimmed(grace, log); err != nil {
			log.Error("the engine's supervisor did not stop it; poold ends its processes itself", "err", err)
		}
	}
	if err := e.tree().End(grace, e.hurry, log); err != nil {
		return err
	}
	<-e.exited
	if e.cgroup != "" {
		if err := proc.RemoveCgroup(e.cgroup); err != nil {
			log.Warn("removing the engine's cgroup", "profile", e.profile.ID, "cgroup", e.cgroup, "err", err)
		}
	}
	return nil
}

// tree is what stopping the engine ends.
func (e *engine) tree() proc.Tree {
	if e.cgroup != "" {
		return proc.CgroupTree(e.cgroup, e.pid)
	}
	return proc.GroupTree(e.pid, e.token, e.startTicks)
}

// members lists the engine's live processes.
func (e *engine) members() []int { return e.tree().Members() }

// portAttempts bounds the starts of one engine whose port was taken.
const portAttempts = 3

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// isClosed reports whether c is closed; a nil c never is.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
