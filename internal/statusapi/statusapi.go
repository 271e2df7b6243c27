// Package statusapi holds the wire types of the daemons' read-only JSON
// endpoints: poold's GET /status and GET /v1/models, which fleetd and
// `poold status` read, and fleetd's GET /status and GET /v1/models, which
// `fleetd status` reads. Their JSON shapes are contracts (docs/design.md): a
// field may be added, never renamed or removed.
//
// The package holds types only, so that a reader of these endpoints depends
// on nothing else of the daemon that serves them.
package statusapi

import "time"

// Poold is the body of poold's GET /status.
type Poold struct {
	Version string `json:"version"`
	Host    string `json:"host"`
	// Config describes the profiles file in force.
	Config File `json:"config"`
	// Tenants describes the tenants file in force; absent without one.
	Tenants *File `json:"tenants,omitempty"`
	GPU     GPUs  `json:"gpu"`
	// Containment says how poold keeps account of its engines' processes.
	Containment Containment `json:"containment"`
	Pools       []Pool      `json:"pools"`
	// Usage describes the usage ledger; absent when it is off.
	Usage *Usage `json:"usage,omitempty"`
}

// Containment says how poold keeps account of its engines' processes
// (docs/security.md): Mode "cgroup", each engine in a cgroup v2 group of its
// own under Cgroup (poold's delegated cgroup's directory), or Mode
// "process-group", each engine a process group and the processes that left
// it found by their environment and parents, with the Reason no cgroup is
// used.
type Containment struct {
	Mode   string `json:"mode"`
	Cgroup string `json:"cgroup,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Usage is the usage ledger's state (docs/usage.md): its database, the rows
// waiting for its writer, those the database did not take yet (in the
// spool), those written and those lost since start, the
// last failed write (nil after a good one), and, when it ships rows to
// PostgreSQL, the shipping.
type Usage struct {
	Path      string    `json:"path"`
	Queued    int       `json:"queued"`
	Spooled   int       `json:"spooled"`
	Written   uint64    `json:"written"`
	Dropped   uint64    `json:"dropped"`
	LastError *string   `json:"lastError"`
	Shipping  *Shipping `json:"shipping,omitempty"`
}

// Shipping is the state of the usage rows' shipping to PostgreSQL: where
// to (no credentials), the rows not shipped yet and the age of the oldest
// (0 when none waits), when rows were last shipped (nil: not yet), and the
// last error (nil after a good attempt).
type Shipping struct {
	Target            string     `json:"target"`
	BacklogRows       int64      `json:"backlogRows"`
	BacklogAgeSeconds float64    `json:"backlogAgeSeconds"`
	LastShippedAt     *time.Time `json:"lastShippedAt"`
	LastError         *string    `json:"lastError"`
}

// File describes a watched settings file in force: poold's profiles file or
// fleetd's hosts file. LastError is the reason the last reload was refused;
// nil when it was not.
type File struct {
	Path      string    `json:"path"`
	SHA256    string    `json:"sha256"`
	LoadedAt  time.Time `json:"loadedAt"`
	LastError *string   `json:"lastError"`
}

// GPUs says whether GPU telemetry is available, and if not, why; when it is,
// Devices is every GPU's telemetry.
type GPUs struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	Devices   []GPU  `json:"devices,omitempty"`
}

// GPU is one GPU's telemetry at one moment. Index is the index nvidia-smi
// shows, which is what a pool's "gpus" list names.
type GPU struct {
	Index            int          `json:"index"`
	UUID             string       `json:"uuid"`
	Name             string       `json:"name"`
	MemoryUsedBytes  uint64       `json:"memoryUsedBytes"`
	MemoryTotalBytes uint64       `json:"memoryTotalBytes"`
	Utilization      float64      `json:"utilization"` // 0..1
	TemperatureC     int          `json:"temperatureC"`
	PowerWatts       float64      `json:"powerWatts"`
	Processes        []GPUProcess `json:"processes"`
	// ECCErrors counts the memory's ECC errors since the driver last
	// loaded (NVML's volatile counters); nil where ECC is off or
	// unsupported.
	ECCErrors *ECCErrors `json:"eccErrors"`
}

// ECCErrors are a GPU's ECC memory error counts.
type ECCErrors struct {
	Corrected   uint64 `json:"corrected"`
	Uncorrected uint64 `json:"uncorrected"`
}

// GPUProcess is one compute process on a GPU. UsedBytes is 0 when unknown.
type GPUProcess struct {
	PID       int    `json:"pid"`
	UsedBytes uint64 `json:"usedBytes"`
}

// The values of Pool.State. What each means, and how a pool moves between
// them, is poold's pool.State.
const (
	StateEmpty    = "empty"
	StateStarting = "starting"
	StateReady    = "ready"
	StateDraining = "draining"
	StateStopping = "stopping"
	StateSleeping = "sleeping"
	StateFailed   = "failed"
)

// Pool is one pool's entry in poold's GET /status.
type Pool struct {
	Name  string `json:"name"`
	GPUs  []int  `json:"gpus"`
	State string `json:"state"` // one of the State constants
	// Profile is the loaded profile's id; nil when none is loaded.
	Profile *string `json:"profile"`
	// SwitchingTo is the profile being loaded; nil when none.
	SwitchingTo *string `json:"switchingTo"`
	InFlight    int     `json:"inFlight"`
	// Waiting counts the queued requests by profile.
	Waiting      map[string]int `json:"waiting"`
	OldestWaitMs int64          `json:"oldestWaitMs"`
	// Gate is "open" when requests for the loaded profile are admitted,
	// "closed" while the pool drains towards a swap.
	Gate string `json:"gate"`
	// LastUsed is when a lease was last taken or returned; zero when never.
	LastUsed  time.Time   `json:"lastUsed"`
	LastError *string     `json:"lastError"`
	Since     time.Time   `json:"since"`
	Engine    *Engine     `json:"engine"`
	Sleeping  []Sleeper   `json:"sleeping"`
	GPUMemory []GPUMemory `json:"gpuMemory"`
	// EngineStats is how loaded the awake engine says it is, from its own
	// metrics; nil when there is no awake engine or no recent sample.
	EngineStats *EngineStats `json:"engineStats"`
	// Adoption is what this poold made, at its start, of each engine of the
	// pool that the previous poold left running (keep-engines-on-restart);
	// empty when there was none.
	Adoption []Adoption `json:"adoption,omitempty"`
	// ReleaseAt is when the idle engine is to be released (its profile's
	// idleTimeout, or a request's keep_alive, after the last request
	// ended); nil when no release is due. ReleaseAction is what the release
	// will do: "sleep" where the profile sleeps (a full sleep budget stops
	// it after all), else "stop"; "" when none is due.
	ReleaseAt     *time.Time `json:"releaseAt,omitempty"`
	ReleaseAction string     `json:"releaseAction,omitempty"`
	// Failing is the profile whose engine failed, once or more in a row,
	// while no engine of it is ready again: its restart backoff's streak,
	// which a reload that changes the profile, or an operator's POST
	// /admin/pools/{pool}/clear-backoff, ends too. Nil when none.
	Failing *Failing `json:"failing,omitempty"`
}

// Failing is a profile whose engine keeps failing (Pool.Failing).
type Failing struct {
	Profile string `json:"profile"`
	// Failures counts its engines' failures in a row.
	Failures int `json:"failures"`
	// Exit is how the last of them ended: ExitLoadFailed, ExitCrashed or
	// ExitFirstRequest.
	Exit string `json:"exit"`
	// Reason is what that engine said went wrong: the last line of its
	// output that read as the exception ending a traceback, from the
	// exception's name on; "" when none did.
	Reason string `json:"reason,omitempty"`
	// LastError is that failure's error, whole.
	LastError string `json:"lastError"`
	// RetryAt is the earliest next start: until then its requests get 503
	// engine_backoff at once. Nil when it may start now (after a first
	// failure, or once the wait ran out).
	RetryAt *time.Time `json:"retryAt"`
}

// The actions of an idle release (Pool.ReleaseAction).
const (
	ReleaseStop  = "stop"
	ReleaseSleep = "sleep"
)

// How an engine that failed ended: the reasons of poold_engine_exits_total
// but "stopped". ExitLoadFailed: it did not become ready; ExitCrashed: it
// died or failed while serving; ExitFirstRequest: it died (or failed)
// while serving its first request(s), before any succeeded.
const (
	ExitLoadFailed   = "load_failed"
	ExitCrashed      = "crashed"
	ExitFirstRequest = "first_request_failed"
)

// Adoption is one engine that the previous poold left running: adopted (it
// serves, or sleeps, without a load), or stopped for Reason, after which
// the pool loaded afresh.
type Adoption struct {
	Profile string `json:"profile"`
	PID     int    `json:"pid"`
	// Sleeping is the sleep level it was recorded at; 0 when awake.
	Sleeping int    `json:"sleeping,omitempty"`
	Adopted  bool   `json:"adopted"`
	Reason   string `json:"reason,omitempty"`
}

// EngineStats is what a pool's awake engine last reported on its own
// /metrics (vLLM's vllm:* series), as poold sampled it.
type EngineStats struct {
	// Running and Waiting are the requests in the engine's running batch
	// and in its own queue (those poold admitted beyond the engine's
	// --max-num-seqs, say).
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// KVCacheUsage is the share of the engine's KV cache in use, 0 to 1.
	KVCacheUsage float64 `json:"kvCacheUsage"`
	// PrefixCacheHitRate is the share of prompt tokens looked up in the
	// prefix cache that were found there, over about the last minute; nil
	// when the engine looked none up in that time.
	PrefixCacheHitRate *float64 `json:"prefixCacheHitRate"`
	// SleepLevel is the sleep level the engine reported of itself
	// (vllm:engine_sleep_state): 1 or 2 when it said it sleeps, though
	// poold had not put it to sleep; 0 (left out) when awake or not
	// reported. The pool then takes it for a sleeper
	// (Sleeper.SelfSlept) where it can wake it.
	SleepLevel int `json:"sleepLevel,omitempty"`
	// SampledAt is when the engine was scraped.
	SampledAt time.Time `json:"sampledAt"`
}

// Ready is the body of poold's GET /ready: Status "ready" (200) while every
// pool with demand can take more; "degraded" (200) likewise, while poold
// serves with something wrong, the Reasons (as /health's); "saturated"
// (503) with the Saturated pools and why; "draining" (503) once a shutdown
// began. Reasons are given whatever the status.
type Ready struct {
	Status    string       `json:"status"`
	Saturated []Saturation `json:"saturated,omitempty"`
	Reasons   []string     `json:"reasons,omitempty"`
}

// Saturation is one reason a pool with demand can take no more: Reason
// "engine_waiting" (its engine queues more requests than poold's
// ready-max-engine-waiting), "kv_cache_full" (its engine's KV cache use is
// above ready-max-kv-cache-usage) or "queue_full" (poold's own queue for
// the pool is full).
type Saturation struct {
	Pool    string `json:"pool"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Engine describes a pool's current engine process.
type Engine struct {
	Profile   string    `json:"profile"`
	PID       int       `json:"pid"`
	Port      int       `json:"port"`
	StartedAt time.Time `json:"startedAt"`
	// ReadyAt is when it passed the readiness gate; nil while it loads.
	ReadyAt *time.Time `json:"readyAt"`
}

// Sleeper describes a sleeping engine (docs/sleep-mode.md).
type Sleeper struct {
	Profile string    `json:"profile"`
	Level   int       `json:"level"`
	Since   time.Time `json:"since"` // when it fell asleep
	// HostBytes is the host RAM it holds (its weights at level 1; 0 at
	// level 2 or when the weight size is unknown).
	HostBytes int64 `json:"hostBytes"`
	PID       int   `json:"pid"`
	Port      int   `json:"port"`
	// SelfSlept is set for an engine that fell asleep by itself (the idle
	// sleep of the newest vLLM servers) while it served, which poold
	// noticed in its metrics and /is_sleeping: the next request wakes it
	// as any sleeper. False for one poold put to sleep.
	SelfSlept bool `json:"selfSlept,omitempty"`
}

// GPUMemory is one GPU's memory, when known.
type GPUMemory struct {
	Index      int    `json:"index"`
	UsedBytes  uint64 `json:"usedBytes"`
	TotalBytes uint64 `json:"totalBytes"`
}

// ModelObject is the OpenAI model object that begins every entry of
// GET /v1/models and the answer of GET /v1/models/{id}. Root is the
// canonical profile id the name resolves to.
type ModelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Root    string `json:"root"`
	// MaxModelLen is the model's context length, as vLLM lists it; zero
	// (left out) when unknown.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// Model is one entry of poold's GET /v1/models: the OpenAI model object plus
// poold's view of where it runs.
type Model struct {
	ModelObject
	// State is "ready" where it serves now, "loading" while it starts, else
	// "available".
	State string `json:"state"`
	// Pools are the pools it may run on; empty means every pool.
	Pools []string `json:"pools"`
}

// ModelList is the body of GET /v1/models.
type ModelList[M any] struct {
	Object string `json:"object"`
	Data   []M    `json:"data"`
}

// Fleetd is the body of fleetd's GET /status: the hosts file, the tenants
// file when there is one, and every host with its last polled pools.
type Fleetd struct {
	Version   string `json:"version"`
	HostsFile File   `json:"hostsFile"`
	// TenantsFile and TenantLimits are absent without a tenants file.
	TenantsFile  *File         `json:"tenantsFile,omitempty"`
	TenantLimits *TenantLimits `json:"tenantLimits,omitempty"`
	Hosts        []Host        `json:"hosts"`
}

// TenantLimits says where fleetd keeps its tenants' rate limits.
type TenantLimits struct {
	// Store is "memory" (this fleetd's own buckets) or "redis" (shared by
	// the replicas).
	Store string `json:"store"`
	// FailClosed: requests whose limits the store cannot check are refused
	// (else let through).
	FailClosed bool `json:"failClosed"`
	// Reachable is false while the store cannot be reached: since the last
	// check that failed, none has succeeded.
	Reachable bool `json:"reachable"`
	// Disagreements are the tenants to whom another replica sharing the
	// store gives other limits (its tenants file differs): each replica
	// counts them in buckets of its own. Absent when every replica agrees,
	// or without a shared store.
	Disagreements []LimitsDisagreement `json:"disagreements,omitempty"`
}

// LimitsDisagreement is one tenant whose limits differ between this fleetd
// and another replica.
type LimitsDisagreement struct {
	Tenant  string `json:"tenant"`
	Replica string `json:"replica"`
	// Limits are the other replica's ("rpm=60 tpm=0"), Ours this fleetd's.
	Limits string `json:"limits"`
	Ours   string `json:"ours"`
}

// Host is one host in fleetd's GET /status.
type Host struct {
	Name   string            `json:"name"`
	URL    string            `json:"url"`
	Source string            `json:"source"` // "file" or "dns:NAME"
	Labels map[string]string `json:"labels"`
	Weight int               `json:"weight"`
	// Healthy: requests are routed to it (polled, not ejected).
	Healthy   bool `json:"healthy"`
	Reachable bool `json:"reachable"` // the last poll succeeded
	Ejected   bool `json:"ejected"`
	// EjectedFor is the cause of the host's ejection (poll, silent or
	// connect), EjectedUntil its earliest end; absent when not ejected.
	EjectedFor   string     `json:"ejectedFor,omitempty"`
	EjectedUntil *time.Time `json:"ejectedUntil,omitempty"`
	// PollFailures and ForwardFailures count failures in a row.
	PollFailures    int        `json:"pollFailures"`
	ForwardFailures int        `json:"forwardFailures"`
	LastPoll        *time.Time `json:"lastPoll"`
	PollLatencyMs   float64    `json:"pollLatencyMs"`
	LastError       *string    `json:"lastError"`
	Version         string     `json:"version"`
	Pools           []Pool     `json:"pools"`
	// Models is fleetd's passive health of the host's models, from its own
	// forwards: only those that failed there, or whose streams were
	// measured.
	Models []ModelHealth `json:"models,omitempty"`
}

// ModelHealth is what fleetd's forwards say of one model on one host.
type ModelHealth struct {
	Model string `json:"model"`
	// Health is healthy, trial (an ejection ended; the next answer
	// decides), degraded (success ratio too low) or ejected.
	Health string `json:"health"`
	// SuccessRatio is over Answers, the answers of the last 15 to 30 s.
	SuccessRatio float64    `json:"successRatio"`
	Answers      int        `json:"answers"`
	EjectedUntil *time.Time `json:"ejectedUntil,omitempty"`
	// ITLMs is the recent mean gap between stream chunks, as fleetd
	// measured it; 0 when unknown.
	ITLMs float64 `json:"itlMs,omitempty"`
}

// FleetModel is one entry of fleetd's GET /v1/models: the OpenAI model
// object plus where it can run.
type FleetModel struct {
	ModelObject
	// State is the best state among the hosts: ready, loading, sleeping or
	// available.
	State string      `json:"state"`
	Hosts []ModelHost `json:"hosts"`
}

// ModelHost is one host that can serve a model, in fleetd's GET /v1/models.
type ModelHost struct {
	Name string `json:"name"`
	// State is what the host says: "ready", "loading" or "available".
	State string   `json:"state"`
	Pools []string `json:"pools"`
}
