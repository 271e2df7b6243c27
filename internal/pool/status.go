package pool

import "time"

// Status is one pool's entry in GET /status (DESIGN.md §6); its JSON shape is a
// contract read by fleetd and `poold status`.
type Status struct {
	Name         string         `json:"name"`
	GPUs         []int          `json:"gpus"`
	State        State          `json:"state"`
	Profile      *string        `json:"profile"`
	SwitchingTo  *string        `json:"switchingTo"`
	InFlight     int            `json:"inFlight"`
	Waiting      map[string]int `json:"waiting"`
	OldestWaitMs int64          `json:"oldestWaitMs"`
	// Gate is "open" when requests for the loaded profile are admitted, "closed"
	// while the pool drains towards a swap.
	Gate      string          `json:"gate"`
	LastError *string         `json:"lastError"`
	Since     time.Time       `json:"since"`
	Engine    *EngineStatus   `json:"engine"`
	Sleeping  []SleepStatus   `json:"sleeping"`
	GPUMemory []GPUMemoryStat `json:"gpuMemory"`
}

// EngineStatus describes the pool's current engine process.
type EngineStatus struct {
	Profile   string     `json:"profile"`
	PID       int        `json:"pid"`
	Port      int        `json:"port"`
	StartedAt time.Time  `json:"startedAt"`
	ReadyAt   *time.Time `json:"readyAt"`
}

// SleepStatus describes a sleeping engine (docs/sleep-mode.md).
type SleepStatus struct {
	Profile string    `json:"profile"`
	Level   int       `json:"level"`
	Since   time.Time `json:"since"` // when it fell asleep
	// HostBytes is the host RAM it holds (its weights at level 1; 0 at level 2
	// or when the weight size is unknown).
	HostBytes int64 `json:"hostBytes"`
	PID       int   `json:"pid"`
	Port      int   `json:"port"`
}

// GPUMemoryStat is one GPU's memory, when known.
type GPUMemoryStat struct {
	Index      int    `json:"index"`
	UsedBytes  uint64 `json:"usedBytes"`
	TotalBytes uint64 `json:"totalBytes"`
}

// Status returns a consistent snapshot of the pool.
func (p *Pool) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.Now()
	s := &p.sched
	waiting, oldest := s.Waiting()
	st := Status{
		Name:      p.name,
		GPUs:      p.spec.GPUs,
		State:     p.state,
		Profile:   strPtr(s.Loaded()),
		InFlight:  s.InFlight(),
		Waiting:   waiting,
		Gate:      "open",
		Since:     p.since,
		Sleeping:  p.sleepStatusLocked(),
		GPUMemory: []GPUMemoryStat{},
	}
	if t := s.Target(); t != "" {
		st.SwitchingTo = &t
	}
	if p.retiring && p.eng != nil {
		st.Profile = &p.eng.profile.ID // still loaded, draining before a reload stops it
	}
	if !oldest.IsZero() {
		st.OldestWaitMs = now.Sub(oldest).Milliseconds()
	}
	if s.Loaded() == "" || s.gateClosed(now) {
		st.Gate = "closed"
	}
	if p.lastErr != nil {
		msg := p.lastErr.Error()
		st.LastError = &msg
	}
	if e := p.eng; e != nil {
		es := &EngineStatus{Profile: e.profile.ID, PID: e.pid, Port: e.port, StartedAt: e.startedAt}
		if s.Loaded() == e.profile.ID {
			t := p.readyAt
			es.ReadyAt = &t
		}
		st.Engine = es
	}
	return st
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
