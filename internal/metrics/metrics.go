// Package metrics defines every Prometheus collector poold exports (docs/design.md),
// registered against an injected Registerer.
package metrics

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/poold/poold/internal/pool"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/record"
	"github.com/poold/poold/internal/statusapi"
)

// Latency buckets suited to LLM serving: milliseconds to tens of minutes.
var (
	latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
	swapBuckets    = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
)

// Metrics holds poold's collectors. Build it with New; the zero value is not usable.
type Metrics struct {
	mu sync.Mutex // guards configured
	// configured is, per pool, the profiles that may run there, as of the
	// last Configure: the series created at zero for them.
	configured map[string][]string

	requests         *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	ttfb             *prometheus.HistogramVec
	queueWait        *prometheus.HistogramVec
	tenantWait       *prometheus.HistogramVec
	ttft, itl        *prometheus.HistogramVec
	promptTokens     *prometheus.CounterVec
	completionTokens *prometheus.CounterVec
	swaps            *prometheus.CounterVec
	swapDuration     *prometheus.HistogramVec
	engineStarts     *prometheus.CounterVec
	engineExits      *prometheus.CounterVec
	vramHeld         *prometheus.CounterVec
	sleepVRAMHeld    *prometheus.CounterVec
	idleReleases     *prometheus.CounterVec
	scrapeFailures   *prometheus.CounterVec
	engineLogDropped *prometheus.CounterVec
	selfSleeps       *prometheus.CounterVec
	config           FileReload // the profiles file's loads
}

// New registers every collector on reg: the request and swap metrics,
// collectors reading pool snapshots (their engines' stats included) from
// pools at scrape time, the Go and process collectors, and
// poold_build_info.
func New(reg prometheus.Registerer, pools func() []statusapi.Pool, version, revision string) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_requests_total", Help: "Requests answered, by pool, profile (the canonical profile id), status class, streaming, client (the tenant) and outcome (completed, upstream_aborted, client_aborted, client_stalled, shutdown_cut, rate_limited).",
		}, []string{"pool", "profile", "code_class", "stream", "client", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_request_duration_seconds", Help: "Request duration from arrival to the last byte, queueing included.", Buckets: latencyBuckets,
		}, []string{"pool", "profile", "stream"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_time_to_first_byte_seconds", Help: "Time from arrival to the first response byte sent to the client.", Buckets: latencyBuckets,
		}, []string{"pool", "profile"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_queue_wait_seconds", Help: "Time a request waited for its profile to be ready and admitted.", Buckets: latencyBuckets,
		}, []string{"pool", "profile"}),
		tenantWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_client_queue_wait_seconds", Help: "Time a request waited for its lease, by client (the tenant): its model's load and its turn in the fair share.", Buckets: latencyBuckets,
		}, []string{"client"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_time_to_first_token_seconds", Help: "Time from a stream's arrival to the first chunk of generated text sent to the client, queueing included.", Buckets: ttftBuckets,
		}, []string{"pool", "profile", "client"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_inter_token_latency_seconds", Help: "Gaps between the chunks of generated text of a stream, as sent to the client.", Buckets: itlBuckets,
		}, []string{"pool", "profile", "client"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_prompt_tokens_total", Help: "Prompt tokens reported by the engines, by pool, profile and client (the tenant).",
		}, []string{"pool", "profile", "client"}),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_completion_tokens_total", Help: "Completion tokens reported by the engines (or estimated, for a cut stream), by pool, profile and client (the tenant).",
		}, []string{"pool", "profile", "client"}),
		swaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_swaps_total", Help: "Swap attempts, by pool, from and to profile, and result.",
		}, []string{"pool", "from", "to", "result"}),
		swapDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "poold_swap_duration_seconds", Help: "Duration of each swap phase (drain, stop, sleep, vram_release, start, ready, wake), by kind (cold: an engine started; wake: a sleeping one woken).", Buckets: swapBuckets,
		}, []string{"pool", "phase", "kind"}),
		engineStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_engine_starts_total", Help: "Engine starts, by result (ok, failed).",
		}, []string{"pool", "profile", "result"}),
		engineExits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_engine_exits_total", Help: "Engine process exits, by reason (stopped, crashed, load_failed, first_request_failed: died serving its first requests, before any succeeded).",
		}, []string{"pool", "profile", "reason"}),
		vramHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_vram_not_released_total", Help: "Engine stops after which the pool's GPUs still held memory when the bounded VRAM check gave up.",
		}, []string{"pool"}),
		sleepVRAMHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_sleep_vram_not_released_total", Help: "Engines put to sleep whose GPU memory did not drop within the bounded check; each was stopped instead of kept asleep.",
		}, []string{"pool"}),
		idleReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_idle_releases_total", Help: "Idle engines released (their idleTimeout or a request's keep_alive ran out), by what was done: sleep or stop.",
		}, []string{"pool", "profile", "action"}),
		scrapeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_engine_metrics_scrape_failures_total", Help: "Scrapes of an awake engine's own /metrics that failed (no answer in time, an error status, not vLLM's metrics).",
		}, []string{"pool"}),
		engineLogDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_engine_log_dropped_lines_total", Help: "Engine output lines left out of poold's log (logged at debug level only), by reason: own_poll, the engine's access-log line of one of poold's own polls of it.",
		}, []string{"pool", "reason"}),
		selfSleeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "poold_engine_self_sleeps_total", Help: "Serving engines found asleep by themselves (vllm:engine_sleep_state, confirmed by /is_sleeping), by what poold did: wake (taken for a sleeper, woken by poold for the next request) or none (no sleep endpoints to wake it with; counted once per engine).",
		}, []string{"pool", "action"}),
		config: newFileReload("config", "profiles"),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "poold_build_info", Help: "Always 1; labels carry the build.",
	}, []string{"version", "revision"})
	build.WithLabelValues(version, revision).Set(1)
	reg.MustRegister(m.requests, m.duration, m.ttfb, m.queueWait, m.tenantWait, m.ttft, m.itl, m.promptTokens, m.completionTokens,
		m.swaps, m.swapDuration, m.engineStarts, m.engineExits, m.vramHeld, m.sleepVRAMHeld, m.idleReleases, m.scrapeFailures, m.engineLogDropped, m.selfSleeps, m.config.ok, m.config.at, build,
		&poolCollector{pools: pools}, &engineCollector{pools: pools},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Engine start results and exit reasons, the values of their labels.
var (
	startResults = []string{"ok", "failed"}
	exitReasons  = []string{"stopped", statusapi.ExitCrashed, statusapi.ExitLoadFailed, statusapi.ExitFirstRequest}
)

// Configure creates, at zero, the counters of every pool and of every
// profile on each pool it may run on, so that a dashboard and an increase()
// alert see the first event (a series born at 1 has no increase), and
// deletes those of pools and profiles that cfg no longer has. Call it with
// each profiles file applied. poold_swaps_total is labelled by pairs of
// profiles and is created by the first swap of each pair.
func (m *Metrics) Configure(cfg *profile.Config) {
	next := make(map[string][]string, len(cfg.Pools))
	for _, sp := range cfg.Pools {
		var profs []string
		for _, prof := range cfg.Profiles {
			if prof.EligibleOn(sp.Name) {
				profs = append(profs, prof.ID)
			}
		}
		next[sp.Name] = profs
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for pl, profs := range m.configured {
		if _, kept := next[pl]; !kept {
			for _, c := range []*prometheus.CounterVec{m.engineStarts, m.engineExits, m.vramHeld, m.sleepVRAMHeld, m.idleReleases, m.scrapeFailures, m.engineLogDropped, m.selfSleeps} {
				c.DeletePartialMatch(prometheus.Labels{"pool": pl})
			}
			continue
		}
		for _, prof := range profs {
			if !slices.Contains(next[pl], prof) {
				m.engineStarts.DeletePartialMatch(prometheus.Labels{"pool": pl, "profile": prof})
				m.engineExits.DeletePartialMatch(prometheus.Labels{"pool": pl, "profile": prof})
				m.idleReleases.DeletePartialMatch(prometheus.Labels{"pool": pl, "profile": prof})
			}
		}
	}
	for pl, profs := range next {
		m.vramHeld.WithLabelValues(pl)
		m.sleepVRAMHeld.WithLabelValues(pl)
		m.scrapeFailures.WithLabelValues(pl)
		m.engineLogDropped.WithLabelValues(pl, pool.DropOwnPoll)
		m.selfSleeps.WithLabelValues(pl, pool.SelfSleepWake)
		m.selfSleeps.WithLabelValues(pl, pool.SelfSleepNone)
		for _, prof := range profs {
			for _, r := range startResults {
				m.engineStarts.WithLabelValues(pl, prof, r)
			}
			for _, r := range exitReasons {
				m.engineExits.WithLabelValues(pl, prof, r)
			}
			for _, a := range []string{statusapi.ReleaseSleep, statusapi.ReleaseStop} {
				m.idleReleases.WithLabelValues(pl, prof, a)
			}
		}
	}
	m.configured = next
}

// ConfigLoaded records the outcome of a profiles load.
func (m *Metrics) ConfigLoaded(ok bool, at time.Time) { m.config.Loaded(ok, at) }

// Swap implements pool.Observer.
func (m *Metrics) Swap(poolName, from, to, kind, result string, phases map[string]time.Duration) {
	m.swaps.WithLabelValues(poolName, from, to, result).Inc()
	for phase, d := range phases {
		m.swapDuration.WithLabelValues(poolName, phase, kind).Observe(d.Seconds())
	}
	if kind == pool.KindWake {
		return // no engine was started
	}
	startResult := "ok"
	if _, started := phases["start"]; !started || result != "ok" {
		startResult = "failed"
	}
	m.engineStarts.WithLabelValues(poolName, to, startResult).Inc()
}

// EngineExit implements pool.Observer.
func (m *Metrics) EngineExit(poolName, profile, reason string) {
	m.engineExits.WithLabelValues(poolName, profile, reason).Inc()
}

// VRAMNotReleased implements pool.Observer.
func (m *Metrics) VRAMNotReleased(poolName string) {
	m.vramHeld.WithLabelValues(poolName).Inc()
}

// SleepVRAMNotReleased implements pool.Observer.
func (m *Metrics) SleepVRAMNotReleased(poolName string) {
	m.sleepVRAMHeld.WithLabelValues(poolName).Inc()
}

// IdleRelease implements pool.Observer.
func (m *Metrics) IdleRelease(poolName, profile, action string) {
	m.idleReleases.WithLabelValues(poolName, profile, action).Inc()
}

// EngineLogDropped implements pool.Observer.
func (m *Metrics) EngineLogDropped(poolName, reason string) {
	m.engineLogDropped.WithLabelValues(poolName, reason).Inc()
}

// EngineSelfSlept implements pool.Observer.
func (m *Metrics) EngineSelfSlept(poolName, action string) {
	m.selfSleeps.WithLabelValues(poolName, action).Inc()
}

// EngineScrapeFailed counts a failed scrape of the metrics of pool's
// engine (enginestats.Options.Failed).
func (m *Metrics) EngineScrapeFailed(pool string) {
	m.scrapeFailures.WithLabelValues(pool).Inc()
}

// Observe adds a finished request to the metrics. Requests that reached no
// profile are counted under pool and profile "none", so that request input never
// creates label values; those that reached no pool (queue full, load failed),
// under pool "none".
func (m *Metrics) Observe(r *record.Request) {
	pl, prof := r.Pool, r.Profile
	if prof == "" {
		prof = "none"
	}
	if pl == "" {
		pl = "none"
	}
	stream := strconv.FormatBool(r.Stream)
	m.requests.WithLabelValues(pl, prof, codeClass(r.Status), stream, r.Client, cmp.Or(r.Outcome, record.OutcomeCompleted)).Inc()
	m.duration.WithLabelValues(pl, prof, stream).Observe(r.Duration.Seconds())
	if r.Pool == "" {
		return
	}
	m.queueWait.WithLabelValues(pl, prof).Observe(r.QueueWait.Seconds())
	m.tenantWait.WithLabelValues(r.Client).Observe(r.QueueWait.Seconds())
	if r.TTFB > 0 {
		m.ttfb.WithLabelValues(pl, prof).Observe(r.TTFB.Seconds())
	}
	if r.TTFT > 0 {
		m.ttft.WithLabelValues(pl, prof, r.Client).Observe(r.TTFT.Seconds())
	}
	if r.Counted || r.TokensEstimated {
		m.promptTokens.WithLabelValues(pl, prof, r.Client).Add(float64(r.PromptTokens))
		m.completionTokens.WithLabelValues(pl, prof, r.Client).Add(float64(r.CompletionTokens))
	}
}

func codeClass(status int) string {
	switch {
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	case status >= 200:
		return "2xx"
	default:
		return "1xx"
	}
}

// poolCollector reads pool snapshots at scrape time.
type poolCollector struct {
	pools func() []statusapi.Pool
}

var (
	inFlightDesc = prometheus.NewDesc("poold_in_flight_requests", "Requests holding a lease, by pool and profile.", []string{"pool", "profile"}, nil)
	waitingDesc  = prometheus.NewDesc("poold_waiting_requests", "Requests queued, by pool and the profile they wait for.", []string{"pool", "profile"}, nil)
	loadedDesc   = prometheus.NewDesc("poold_pool_loaded_profile", "1 for the profile loaded in each pool.", []string{"pool", "profile"}, nil)
	stateDesc    = prometheus.NewDesc("poold_pool_state", "1 for each pool's current state.", []string{"pool", "state"}, nil)
	sleepingDesc = prometheus.NewDesc("poold_sleeping_engines", "Engines asleep in each pool (sleep mode).", []string{"pool"}, nil)
	poolGPUDesc  = prometheus.NewDesc("poold_pool_gpu_info", "1 for each GPU (NVML index) of each pool: joins the GPU series to the pools.", []string{"pool", "gpu"}, nil)
)

var poolStates = []string{statusapi.StateEmpty, statusapi.StateStarting, statusapi.StateReady, statusapi.StateDraining, statusapi.StateStopping, statusapi.StateSleeping, statusapi.StateFailed}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- waitingDesc
	ch <- loadedDesc
	ch <- stateDesc
	ch <- sleepingDesc
	ch <- poolGPUDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.pools() {
		loaded := ""
		if st.Profile != nil {
			loaded = *st.Profile
			ch <- prometheus.MustNewConstMetric(loadedDesc, prometheus.GaugeValue, 1, st.Name, loaded)
		}
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(st.InFlight), st.Name, loaded)
		ch <- prometheus.MustNewConstMetric(sleepingDesc, prometheus.GaugeValue, float64(len(st.Sleeping)), st.Name)
		for _, g := range st.GPUs {
			ch <- prometheus.MustNewConstMetric(poolGPUDesc, prometheus.GaugeValue, 1, st.Name, strconv.Itoa(g))
		}
		for prof, n := range st.Waiting {
			ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(n), st.Name, prof)
		}
		for _, s := range poolStates {
			v := 0.0
			if st.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, st.Name, s)
		}
	}
}

// AccessLogDropped exports the access-log lines lost so far, read from
// dropped at scrape time: lines the queue in front of the log's
// destination could not hold, or that the destination refused.
func AccessLogDropped(dropped func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "poold_access_log_dropped_lines_total",
		Help: "Access-log lines lost: the destination did not keep up (its queue was full) or refused the write.",
	}, func() float64 { return float64(dropped()) })
}
