// Package pool runs one engine per GPU pool: admission of requests, the swap
// scheduler's decisions, the engine's process lifecycle under the swap contract
// (drain, bounded stop, readiness gate), and placement across the pools of a host.
package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poold/poold/internal/activity"
	proc "github.com/poold/poold/internal/engine" // named apart from the pool's engine type
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/statusapi"
)

// State is where a pool is in its engine's lifecycle. The zero State is
// StateEmpty. /status shows it as its String, the wire's statusapi value.
type State uint8

// The pool states.
const (
	StateEmpty State = iota
	StateStarting
	StateReady
	StateDraining
	StateStopping
	// StateSleeping: the pool puts its engine to sleep before it wakes or
	// starts another (sleep mode).
	StateSleeping
	StateFailed
)

// wireStates are the states' values in /status.
var wireStates = [...]string{
	StateEmpty:    statusapi.StateEmpty,
	StateStarting: statusapi.StateStarting,
	StateReady:    statusapi.StateReady,
	StateDraining: statusapi.StateDraining,
	StateStopping: statusapi.StateStopping,
	StateSleeping: statusapi.StateSleeping,
	StateFailed:   statusapi.StateFailed,
}

// String is s as /status shows it; a value outside the constants is
// State(N).
func (s State) String() string {
	if int(s) < len(wireStates) {
		return wireStates[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// ErrShutdown answers requests still waiting when poold shuts down.
var ErrShutdown = errors.New("poold is shutting down")

// LoadError is a failed engine start or load, handed to every request that
// waited for it.
type LoadError struct {
	Profile string
	Err     error
}

func (e *LoadError) Error() string { return fmt.Sprintf("loading %q: %v", e.Profile, e.Err) }
func (e *LoadError) Unwrap() error { return e.Err }

// Observer receives a pool's lifecycle events, for metrics. Its methods must not
// block. A nil Observer in Options means none.
type Observer interface {
	// Swap reports one finished swap attempt: from ("" when the pool was empty),
	// to, kind (KindCold: an engine was started; KindWake: a sleeping one was
	// woken), result ("ok", "failed", or "wake_failed" for a wake that failed,
	// after which a cold start follows and is reported too) and the duration
	// of each phase (drain, stop or sleep, vram_release, start, ready, wake).
	Swap(pool, from, to, kind, result string, phases map[string]time.Duration)
	// EngineExit reports an engine process that ended, and why: "stopped",
	// or a failure's statusapi.ExitLoadFailed, ExitCrashed or
	// ExitFirstRequest.
	EngineExit(pool, profile, reason string)
	// VRAMNotReleased reports a stopped engine whose GPU memory was still held
	// when the VRAM check gave up.
	VRAMNotReleased(pool string)
	// SleepVRAMNotReleased reports an engine put to sleep whose GPU memory did
	// not drop; the pool stopped it instead of keeping it asleep.
	SleepVRAMNotReleased(pool string)
	// IdleRelease reports an idle engine released (its idleTimeout or a
	// request's keep_alive): action is "sleep" or "stop", what was done.
	IdleRelease(pool, profile, action string)
	// EngineLogDropped reports an engine output line left out of the log
	// (logged at debug level only), and why: DropOwnPoll.
	EngineLogDropped(pool, reason string)
	// EngineSelfSlept reports a serving engine found asleep by itself
	// (selfsleep.go), and what the pool did: SelfSleepWake (taken for a
	// sleeper, which the next request wakes) or SelfSleepNone (it serves no
	// sleep endpoints; reported once per engine).
	EngineSelfSlept(pool, action string)
}

// VRAM reads the pool's GPU memory (through NVML in poold).
//
// Watch is the stop contract's last step: checking that a stopped engine's GPU
// memory was released. It is called just before the stop, with the pool's
// GPUs and the live pids of the engine's process group; the function it
// returns is called once the group is gone and blocks, for at most the
// implementation's own bound, until the memory is released, or returns an
// error naming the processes still holding it.
//
// WatchSleep is the same check for an engine put to sleep, whose processes
// live on: called just before POST /sleep, its function is called once the
// engine confirms it sleeps and blocks, for at most the same bound, until each
// GPU's used memory fell by at least half of what those pids held, or returns
// an error (also when the GPUs cannot be read).
//
// GPUs reads the given GPUs (memory used and total, compute processes), in
// that order, before an engine starts or wakes; it fails when none can be
// read. The pool only reads what it returns.
type VRAM interface {
	Watch(gpus []int, pids []int) (released func() error)
	WatchSleep(gpus []int, pids []int) (released func() error)
	GPUs(gpus []int) ([]statusapi.GPU, error)
}

// Options configures a Pool. Launch is how its engines are started: Self,
// poold's executable (for {poold} in engine commands, and the shims), and
// VLLM, the launcher of the profiles without a command (the vllm-command
// setting); Now defaults to time.Now; a nil VRAM skips the VRAM checks, of
// stops and of sleeps, and the eviction of sleepers for GPU memory (no NVML).
type Options struct {
	Launch   profile.Launch
	Logger   *slog.Logger
	Observer Observer
	VRAM     VRAM
	// Activity receives the pool's activity changes, for the usage ledger
	// (activity.go); nil means none.
	Activity activity.Observer
	// Ledger records the engines started, for crash clean-up; nil records none.
	Ledger *proc.Ledger
	// Containment is how engines' processes are kept account of; nil is
	// process-group mode.
	Containment *proc.Containment
	Now         func() time.Time
	// host counts the host RAM held by the sleepers of all pools of a Set;
	// set by NewSet (nil, outside a Set, is a fresh count per pool).
	host *hostSleep
	// spawn starts the engines of all pools of a Set from one long-lived
	// thread (see proc.Spawner); set by NewSet (nil, outside a Set, starts directly).
	spawn proc.Spawner
	// hurry is closed by Set.Hurry; set by NewSet (nil, outside a Set: never).
	hurry chan struct{}
	// detach is set by Set.Detach: at shutdown, the pools let go of their
	// shimmed engines instead of stopping them. Set by NewSet (nil, outside
	// a Set: never).
	detach *atomic.Bool
	// Shims, when set, starts each engine under a supervisor of its own,
	// which it outlives poold by (proc.Supervisor); nil starts engines as
	// poold's own children, which die with it.
	Shims *proc.Shims
	// Host, when its functions are set, is what a cold start is checked
	// against, as Launch would start it, before anything is drained for it
	// (the engine binary resolves, a local model path exists, no flag vLLM
	// has removed): a
	// request for a profile that fails the check gets a *LoadError at once
	// and the pool's engine stays. The zero value checks nothing.
	Host profile.Host
	// ProbeClient sends the engines' readiness probes; nil means one whose
	// requests time out after 2 s. ControlClient sends the sleep-mode and
	// warm-up calls, each bounded by its own context; nil means a plain
	// client.
	ProbeClient, ControlClient *http.Client
	// HealthInterval is how often a serving engine's /health is polled
	// (healthpoll.go); zero means DefaultHealthInterval, negative none.
	HealthInterval time.Duration
	// LogPolls logs the access-log lines that engines print for poold's own
	// polls of them (GET /v1/models, /health, /is_sleeping, /metrics) like
	// their other output; false logs them at debug level only, each counted
	// by the Observer's EngineLogDropped (enginelog.go).
	LogPolls bool
	// RestartBackoff is the wait before the second start in a row of a profile
	// whose engine failed twice in a row, doubling with each further failure up
	// to MaxRestartBackoff (restartBackoff in backoff.go). Zero values mean
	// DefaultRestartBackoff and DefaultMaxRestartBackoff.
	RestartBackoff, MaxRestartBackoff time.Duration
}

// Pool owns one GPU set and at most one engine on it.
//
// Its run loop is the only goroutine that starts or stops engines. Acquire and
// Lease.Release run on request goroutines and talk to the loop through the
// scheduler (under mu) and the kick channel.
type Pool struct {
	name string
	opts Options
	log  *slog.Logger
	http proc.Clients  // of the calls to its engines
	kick chan struct{} // buffered(1): wakes the run loop
	done chan struct{} // closed when the run loop has ended
	// cancel ends the run loop's context; set by the Set before the loop starts.
	cancel context.CancelFunc

	mu        sync.Mutex // guards every field below
	spec      *profile.PoolSpec
	cfg       *profile.Config
	sched     Scheduler
	state     State
	eng       *engine    // the engine starting or serving; nil when none
	sleepers  []*sleeper // engines asleep (sleep.go), least recently used first
	since     time.Time
	lastErr   error
	lastSwap  time.Duration // duration of the last successful swap, for Retry-After
	readyAt   time.Time
	refused   error // non-nil once the pool admits no more requests: what they get
	drainedAt time.Time
	backoff   restartBackoff // spaces out the restarts of a failing profile
	// reload is what a profiles reload left for the run loop (reload.go).
	reload pendingReload
	// failed is why the engine serving failed though its process lives
	// (Lease.Fail), for the run loop to stop it; nil when it did not.
	failed error
	// selfSlept is the level at which the engine serving said it sleeps by
	// itself (engineAsleep), for the run loop to take it for a sleeper; 0
	// when it did not.
	selfSlept int
	// adoption is what became of the engines the previous poold left
	// (adopt.go), for /status.
	adoption []statusapi.Adoption
	// activity and activityProfile are what Options.Activity was last told.
	activity        activity.Activity
	activityProfile string
}

func newPool(spec *profile.PoolSpec, cfg *profile.Config, opts Options) *Pool {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.host == nil {
		opts.host = new(hostSleep)
	}
	p := &Pool{
		name:  spec.Name,
		opts:  opts,
		log:   opts.Logger.With("component", "pool", "pool", spec.Name),
		http:  proc.NewClients(opts.ProbeClient, opts.ControlClient),
		kick:  make(chan struct{}, 1),
		done:  make(chan struct{}),
		spec:  spec,
		cfg:   cfg,
		state: StateEmpty,
		since: opts.Now(),
	}
	p.backoff.base, p.backoff.max = cmp.Or(opts.RestartBackoff, DefaultRestartBackoff), cmp.Or(opts.MaxRestartBackoff, DefaultMaxRestartBackoff)
	p.sched.Policy = policyFor(spec, cfg)
	return p
}

// policyFor is the scheduling policy of the pool spec under cfg: the pool's
// settings, with the residency of each eligible profile that sets its own
// and the admission ceiling of each that has one.
func policyFor(spec *profile.PoolSpec, cfg *profile.Config) Policy {
	pol := Policy{
		MinResidency:  spec.MinResidency.Duration,
		IdleGrace:     DefaultGraceFloor,
		LearnGrace:    true,
		PriorityAge:   DefaultPriorityAge,
		MaxQueue:      spec.MaxQueue,
		BackgroundAge: DefaultBackgroundAge,
	}
	for _, prof := range cfg.Profiles {
		if !prof.EligibleOn(spec.Name) {
			continue
		}
		if d, own := prof.Residency(spec); own {
			if pol.Residency == nil {
				pol.Residency = make(map[string]time.Duration)
			}
			pol.Residency[prof.ID] = d
		}
		if c := prof.Ceiling(); c > 0 {
			if pol.MaxInFlight == nil {
				pol.MaxInFlight = make(map[string]int)
			}
			pol.MaxInFlight[prof.ID] = c
		}
		if d := prof.IdleTimeout.Duration; d > 0 {
			if pol.IdleTimeout == nil {
				pol.IdleTimeout = make(map[string]time.Duration)
			}
			pol.IdleTimeout[prof.ID] = d
		}
		if d := prof.MaxKeepAlive.Duration; d > 0 {
			if pol.MaxKeepAlive == nil {
				pol.MaxKeepAlive = make(map[string]time.Duration)
			}
			pol.MaxKeepAlive[prof.ID] = d
		}
	}
	return pol
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

// ClearBackoff ends the restart backoff of the pool's failing profile (an
// operator's POST /admin/pools/{pool}/clear-backoff, once its cause is
// fixed): the next request for it starts its engine at once, and its next
// failure is the first of a new streak. It returns the id of the profile
// whose streak it ended, "" when there was none.
func (p *Pool) ClearBackoff() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.backoff.clear()
}

func (p *Pool) observeSwap(from, to, kind, result string, phases map[string]time.Duration) {
	if p.opts.Observer != nil {
		p.opts.Observer.Swap(p.name, from, to, kind, result, phases)
	}
}

// outputLog is where the output of the pool's engines goes.
func (p *Pool) outputLog() outputLog {
	o := outputLog{log: p.log, keepPolls: p.opts.LogPolls}
	if obs := p.opts.Observer; obs != nil {
		o.dropped = func() { obs.EngineLogDropped(p.name, DropOwnPoll) }
	}
	return o
}

func (p *Pool) observeExit(profile, reason string) {
	if p.opts.Observer != nil {
		p.opts.Observer.EngineExit(p.name, profile, reason)
	}
}
