// Package profile decodes, defaults and validates the profiles JSON that tells poold
// which models it may serve, on which GPU pools and how (docs/design.md), and indexes
// every servable name for O(1) resolution.
package profile

import (
	"time"
)

// Default timeouts applied when neither the profile nor the file's defaults set one.
const (
	DefaultStartupTimeout = 30 * time.Minute
	DefaultStopTimeout    = 90 * time.Second
	DefaultMinResidency   = 30 * time.Second
	DefaultMaxQueue       = 256
	DefaultMaxQueueWait   = 10 * time.Minute
	// DefaultMaxSleeping is how many sleeping engines a pool keeps when its
	// maxSleeping is unset (docs/sleep-mode.md).
	DefaultMaxSleeping = 1
	// DefaultSleepMinResidency caps the minResidency of a sleep-enabled profile
	// that sets none of its own: about one level-1 wake of a large model
	// (3–6 s on an A100), as the 30 s default is about one cold start.
	DefaultSleepMinResidency = 5 * time.Second
)

// Config is one decoded, defaulted and validated profiles file. It is immutable once
// returned by Parse or Load: reloads build a new Config and swap it in whole.
// The zero value serves nothing.
type Config struct {
	Pools    []*PoolSpec `json:"pools"`
	Defaults Defaults    `json:"defaults"`
	Profiles []*Profile  `json:"profiles"`

	names  map[string]*Profile // id and every alias → profile
	pools  map[string]*PoolSpec
	sorted []string // the keys of names, sorted
}

// PoolSpec is a named set of GPUs that holds at most one awake engine.
type PoolSpec struct {
	Name string `json:"name"`
	GPUs []int  `json:"gpus"`
	// Default is the profile id or alias preloaded at start-up; empty means the pool
	// starts empty.
	Default string `json:"default,omitempty"`
	// MinResidency is how long a freshly loaded profile keeps the pool while it still
	// has demand before waiters for other profiles close the gate; zero means the
	// file's default (DefaultMinResidency unless defaults.minResidency is set).
	MinResidency Duration `json:"minResidency,omitzero"`
	// MaxQueue bounds the requests waiting on this pool; zero means DefaultMaxQueue.
	MaxQueue int `json:"maxQueue,omitempty"`
	// MaxQueueWait bounds how long one request waits; zero means DefaultMaxQueueWait.
	MaxQueueWait Duration `json:"maxQueueWait,omitzero"`
	// MaxSleeping bounds the sleeping engines the pool keeps besides its awake
	// one; zero means DefaultMaxSleeping.
	MaxSleeping int `json:"maxSleeping,omitempty"`
	// AllowNonLoopback lets an engine that listens beyond loopback on its
	// port serve anyway (reported in the pool's lastError); false, the
	// default, stops it and fails the load.
	AllowNonLoopback bool `json:"allowNonLoopback,omitempty"`
}

// Defaults are applied to every profile that leaves the field unset.
type Defaults struct {
	StartupTimeout Duration          `json:"startupTimeout,omitzero"`
	StopTimeout    Duration          `json:"stopTimeout,omitzero"`
	Env            map[string]string `json:"env,omitempty"`
	// PassEnv names variables of poold's own environment that every engine
	// inherits besides the allowlisted ones (see Profile.Inherited).
	PassEnv      []string `json:"passEnv,omitempty"`
	MinResidency Duration `json:"minResidency,omitzero"`
	MaxQueue     int      `json:"maxQueue,omitempty"`
	MaxQueueWait Duration `json:"maxQueueWait,omitzero"`
	// IdleTimeout and MaxKeepAlive are the profiles' defaults of the same
	// names.
	IdleTimeout  Duration `json:"idleTimeout,omitzero"`
	MaxKeepAlive Duration `json:"maxKeepAlive,omitzero"`
	// SleepMemoryBudget bounds, in bytes, the host RAM that the sleeping
	// engines of all pools hold (level 1 keeps a model's weights in host RAM);
	// zero means no bound besides each pool's maxSleeping. It is a host
	// setting, not a profile default.
	SleepMemoryBudget int64 `json:"sleepMemoryBudget,omitempty"`
}

// Profile says how to serve one model.
type Profile struct {
	// ID is the canonical model id: the name the engine serves and upstream requests carry.
	ID      string   `json:"id"`
	Aliases []string `json:"aliases,omitempty"`
	// Model is the path or hub name handed to the launcher (Launch.VLLM) as --model.
	Model string `json:"model"`
	// Pools lists the pools this profile may run on; empty means every pool.
	Pools       []string          `json:"pools,omitempty"`
	MaxModelLen int               `json:"maxModelLen,omitempty"`
	Args        []string          `json:"args,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	// PassEnv names variables of poold's own environment that the engine
	// inherits besides the allowlisted ones (see Inherited); with the file's
	// defaults.passEnv once defaults are applied.
	PassEnv []string `json:"passEnv,omitempty"`
	// Command, when set, replaces the launcher's argv (Argv); {port}, {model}, {id} and
	// {poold} (this daemon's own executable) are substituted inside every argument.
	Command        []string `json:"command,omitempty"`
	StartupTimeout Duration `json:"startupTimeout,omitzero"`
	StopTimeout    Duration `json:"stopTimeout,omitzero"`
	// Priority orders waiting profiles: higher goes first, and waiting time ages a
	// lower priority up so it is never starved. Zero is the normal priority.
	Priority int `json:"priority,omitempty"`
	// MaxInFlight is the admission ceiling of the profile's engine: requests
	// beyond it wait in poold's queue, where the tenants' fair share orders
	// them, not in the engine's. Zero means the engine's --max-num-seqs when
	// its arguments set it, else no ceiling (see Ceiling).
	MaxInFlight int `json:"maxInFlight,omitempty"`
	// MinResidency, when set, replaces the pool's minResidency while this profile
	// is loaded (a model that is slow to load can keep the pool longer, a cheap
	// one can give it up at once with "0s"); unset means the pool's.
	MinResidency Duration `json:"minResidency,omitzero"`
	// MaxQueueWait, when set, replaces the pool's maxQueueWait for requests for
	// this profile (a big model's cold load can outlast the pool's bound); unset
	// means the pool's.
	MaxQueueWait Duration `json:"maxQueueWait,omitzero"`
	// Sleep, when set, puts the engine to sleep instead of stopping it when the
	// pool swaps to another profile, and wakes it when the profile is wanted
	// again (docs/sleep-mode.md); nil means a full stop.
	Sleep *Sleep `json:"sleep,omitempty"`
	// IdleTimeout is how long the engine stays once no request is in
	// flight or queued for it, before the pool releases it (puts it to
	// sleep where Sleep allows, else stops it) and stays empty; zero means
	// never, unless a request's keep_alive asks for less.
	IdleTimeout Duration `json:"idleTimeout,omitzero"`
	// MaxKeepAlive bounds the keep_alive a request may ask for; unset
	// means the file's default, else IdleTimeout (a client may shorten the
	// stay, not lengthen it), and with neither, no bound.
	MaxKeepAlive Duration `json:"maxKeepAlive,omitzero"`
	// WeightBytes is the size of the model's weights, which a level-1 sleeper
	// holds in host RAM; zero means estimated from the size of the model
	// directory where it is readable (unknown otherwise).
	WeightBytes int64 `json:"weightBytes,omitempty"`
}

// Sleep is a profile's sleep-mode setting.
type Sleep struct {
	// Level is vLLM's sleep level: 1 offloads the weights to host RAM and drops
	// the KV cache, 2 drops both (the wake reloads the weights from disk).
	Level int `json:"level"`
}

// SleepLevel is p's sleep level, 0 when sleep mode is off.
func (p *Profile) SleepLevel() int {
	if p.Sleep == nil {
		return 0
	}
	return p.Sleep.Level
}

// Duration is a time.Duration written in JSON as a Go duration string ("90s", "30m").
// The zero value means unset. A string that does not parse decodes without error, to
// zero, and is reported by validation with every other problem in the file.
type Duration struct {
	time.Duration

	text  string // as written in the file
	given bool   // the file gave a string (possibly an invalid one)
}
