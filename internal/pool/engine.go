package pool

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// logLines is how many of an engine's last output lines are kept for error reports.
const logLines = 30

// engine is one engine subprocess, as the pool runs it: its process is
// the handle's (proc.Handle). Its fields are set before start returns and
// not changed afterwards, except unwatch (the run loop's alone), and the
// log ring, noted and the other atomics (safe for concurrent use).
type engine struct {
	profile *profile.Profile
	// h is its process, as the pool's Supervisor started or adopted it;
	// port is the one it serves on, chosen by the pool.
	h         proc.Handle
	port      int
	gpus      []int    // the pool's GPUs when it started: a reload may move the pool, not the engine
	target    *url.URL // http://127.0.0.1:port, shared read-only by every lease
	startedAt time.Time
	argv, env []string // the command line and the environment (engineEnv), but the token
	// given is the part of env that poold gives on purpose (givenEnv): with
	// argv, what the engine's fingerprint covers.
	given []string

	api proc.API // its HTTP API on its port
	// idle is how long a connection to it may stay idle (idleTimeout).
	idle time.Duration
	// hurry, once closed, cuts the SIGTERM grace of a stop short (a second
	// signal at shutdown); nil never is.
	hurry <-chan struct{}

	pumped chan struct{} // closed once every writer closed the log pipe
	logs   *proc.Output
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
// port, before it has a process: its handle is the caller's to set, and
// run starts following it. hc are the clients of poold's calls to it;
// hurry, once closed, cuts its stop's grace short (nil: never).
func newEngine(prof *profile.Profile, spec *profile.PoolSpec, launch profile.Launch, port int, hc proc.Clients, hurry <-chan struct{}) *engine {
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
		api:       hc.At(port),
		idle:      idleTimeout(env),
		hurry:     hurry,
		pumped:    make(chan struct{}),
		logs:      proc.NewOutput(logLines),
	}
}

// engineStart is what startEngine starts an engine from. Launch is how
// its command line is made: poold's own executable (substituted for
// {poold} in commands) and the launcher of profiles without a command.
// Supervisor starts its process (nil: the zero Supervisor's way, poold's
// own child in process-group mode). HTTP are the clients of poold's calls
// to it; Hurry, once closed, cuts its stop's grace short (nil: never);
// Output is where its output lines, and poold's about it, are logged.
type engineStart struct {
	Profile    *profile.Profile
	Spec       *profile.PoolSpec
	Launch     profile.Launch
	Supervisor *proc.Supervisor
	HTTP       proc.Clients
	Hurry      <-chan struct{}
	Output     outputLog
}

// startEngine starts the engine that o describes on a free loopback port.
func startEngine(o engineStart) (*engine, error) {
	prof, spec, sup := o.Profile, o.Spec, o.Supervisor
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("choosing a port: %w", err)
	}
	if sup == nil {
		sup = &proc.Supervisor{}
	}
	e := newEngine(prof, spec, o.Launch, port, o.HTTP, o.Hurry)
	e.h, err = sup.Start(proc.Spec{Argv: e.argv, Env: e.env, Given: e.given, Token: rand.Text(), Port: port, Pool: spec.Name,
		Grace: prof.StopTimeout.Duration, Log: o.Output.log.With("profile", prof.ID)})
	if err != nil {
		return nil, err
	}
	output := o.Output.with("profile", prof.ID, "pid", e.h.PID())
	rec := e.h.Record()
	output.log.Info("engine started", "port", port, "argv", strings.Join(e.argv, " "), "cgroup", rec.Cgroup, "shim", rec.Shim)
	e.run(output)
	return e, nil
}

// supervisor is what starts and adopts the pool's engines: under shims
// with Options.Shims, from the Set's spawner thread, in the pool's
// containment.
func (p *Pool) supervisor() *proc.Supervisor {
	return &proc.Supervisor{Shims: p.opts.Shims, Spawn: p.opts.spawn, Containment: p.opts.Containment, Self: p.opts.Launch.Self}
}

// run reads the engine's output into output, after the lines that a
// previous poold received of it (proc.Handle.Seen), which go into the log
// ring alone.
func (e *engine) run(output outputLog) {
	for _, line := range e.h.Seen() {
		e.noteReason(line)
		e.logs.Add(line)
	}
	go e.pump(e.h.Output(), output)
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

// loopbackURL is the base URL of an engine listening on port.
func loopbackURL(port int) *url.URL {
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}
}

// awaitOutput waits, once the engine has exited, until its output has been
// read to the end (every writer closed the pipe), or proc.OutputWait
// passes: the pipe is read asynchronously, and the last lines say why it
// exited.
func (e *engine) awaitOutput() {
	if !isClosed(e.h.Exited()) {
		return
	}
	t := time.NewTimer(proc.OutputWait)
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
	if err := e.h.Err(); err != nil {
		status = err.Error()
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

// stop ends all of the engine's processes (proc.Handle.Stop): its cgroup,
// or its process group and what left it, through its shim first for an
// engine under one.
func (e *engine) stop(grace time.Duration, log *slog.Logger) error {
	return e.h.Stop(grace, e.hurry, log.With("profile", e.profile.ID, "pid", e.h.PID()))
}

// detach lets go of an engine under a shim for the next poold to adopt
// (proc.Handle.Detach), and reports whether it did: one that is poold's own
// child cannot be let go of.
func (e *engine) detach() bool {
	if !e.h.Detach() {
		return false
	}
	e.unwatchHealth()
	return true
}

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
