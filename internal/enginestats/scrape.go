package enginestats

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/poold/poold/internal/statusapi"
)

// Options configures a Scraper.
type Options struct {
	// Interval is how often each awake engine is scraped; it must be
	// positive.
	Interval time.Duration
	// Timeout bounds one scrape; zero means Interval.
	Timeout time.Duration
	// Pools returns every pool with its engine, as /status shows them.
	Pools func() []statusapi.Pool
	// Failed, if not nil, is called with the pool's name for each failed
	// scrape.
	Failed func(pool string)
	// Asleep, if not nil, is called with the pool's name, its engine's pid
	// and port, and the level, for each good sample in which the engine
	// says it sleeps (Stats.SleepLevel): asleep by itself, or put to sleep
	// by poold between the listing of the pools and the scrape. It is
	// called from the scraping goroutine, no lock held, and the next round
	// waits for it: it must not block for long.
	Asleep func(pool string, pid, port, level int)
	// Logger receives a warning when a pool's scrapes start failing and a
	// note when they work again; nil discards.
	Logger *slog.Logger
}

// maxBody bounds the /metrics body read from an engine.
const maxBody = 16 << 20

// prefixWindow is how many scrapes the prefix-cache hit rate spans: a
// minute at the default interval.
const prefixWindow = 60

// A Scraper samples the /metrics of every pool's awake engine (one ready to
// serve) each Interval, from one goroutine (Run) that scrapes the pools'
// engines at once and waits for every scrape before the next round, and
// keeps the last good sample of each. It never blocks a request: requests
// only read samples, under a mutex held for a map look-up. Build it with
// New.
type Scraper struct {
	opts   Options
	log    *slog.Logger
	tr     *http.Transport
	client *http.Client
	// stale is the age past which a sample no longer describes its engine.
	stale time.Duration

	mu    sync.Mutex        // guards pools
	pools map[string]*state // by pool name: pools with an awake engine
}

// state is one pool's engine as scraped: the engine (pid and port), its
// last good sample and the prefix-cache counters of the last scrapes.
type state struct {
	pid, port int
	at        time.Time // of the last good sample; zero: none yet
	stats     Stats
	failing   bool // the last scrape failed
	// points are the prefix-cache counters of up to prefixWindow+1
	// scrapes, oldest first (a new engine's first point is zero: its
	// counters start there).
	points []prefixPoint
}

type prefixPoint struct{ queries, hits float64 }

// New returns a Scraper for opts; Run starts it.
func New(opts Options) *Scraper {
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Interval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}
	return &Scraper{
		opts:   opts,
		log:    log.With("component", "enginestats"),
		tr:     tr,
		client: &http.Client{Transport: tr},
		stale:  3*opts.Interval + opts.Timeout,
		pools:  make(map[string]*state),
	}
}

// Run scrapes every Interval until ctx ends.
func (s *Scraper) Run(ctx context.Context) {
	defer s.tr.CloseIdleConnections()
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.scrapeAll(ctx)
		}
	}
}

// target is a pool's awake engine.
type target struct {
	pool      string
	pid, port int
}

// scrapeAll scrapes every awake engine at once and waits for them all.
func (s *Scraper) scrapeAll(ctx context.Context) {
	var targets []target
	for _, p := range s.opts.Pools() {
		if e := p.Engine; e != nil && e.ReadyAt != nil {
			targets = append(targets, target{p.Name, e.PID, e.Port})
		}
	}
	s.forget(targets)
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Go(func() {
			st, err := s.scrape(ctx, t.port)
			if ctx.Err() != nil {
				return // shutting down: not a failure of the engine
			}
			s.record(t, st, err, time.Now())
			if err == nil && st.SleepLevel > 0 && s.opts.Asleep != nil {
				s.opts.Asleep(t.pool, t.pid, t.port, st.SleepLevel)
			}
		})
	}
	wg.Wait()
}

// forget drops the state of pools that have no awake engine now.
func (s *Scraper) forget(targets []target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.pools {
		kept := false
		for _, t := range targets {
			kept = kept || t.pool == name
		}
		if !kept {
			delete(s.pools, name)
		}
	}
}

// scrape reads and parses one engine's /metrics.
func (s *Scraper) scrape(ctx context.Context, port int) (Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Stats{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return Stats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Stats{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	st, err := Parse(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return Stats{}, fmt.Errorf("GET %s: %w", url, err)
	}
	return st, nil
}

// record keeps the outcome of a scrape of t's engine made at now.
func (s *Scraper) record(t target, st Stats, err error, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.pools[t.pool]
	if ps == nil || ps.pid != t.pid || ps.port != t.port {
		ps = &state{pid: t.pid, port: t.port, points: []prefixPoint{{}}}
		s.pools[t.pool] = ps
	}
	if err != nil {
		if s.opts.Failed != nil {
			s.opts.Failed(t.pool)
		}
		if !ps.failing {
			s.log.Warn("scraping an engine's metrics failed; its engineStats go stale", "pool", t.pool, "port", t.port, "err", err)
		}
		ps.failing = true
		return
	}
	if ps.failing {
		s.log.Info("scraping an engine's metrics works again", "pool", t.pool, "port", t.port)
	}
	ps.failing = false
	ps.at, ps.stats = now, st
	if st.HasPrefixCounters {
		p := prefixPoint{st.PrefixQueries, st.PrefixHits}
		if last := ps.points[len(ps.points)-1]; p.queries < last.queries || p.hits < last.hits {
			ps.points = append(ps.points[:0], prefixPoint{}) // the counters were reset
		}
		if len(ps.points) > prefixWindow {
			ps.points = append(ps.points[:0], ps.points[1:]...)
		}
		ps.points = append(ps.points, p)
	}
}

// Fill sets the EngineStats of each pool whose engine has a sample at most
// a few intervals old (3 × Interval + Timeout), and leaves the others'
// nil.
func (s *Scraper) Fill(pools []statusapi.Pool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range pools {
		p := &pools[i]
		ps := s.pools[p.Name]
		if ps == nil || ps.at.IsZero() || p.Engine == nil || p.Engine.PID != ps.pid || p.Engine.Port != ps.port || now.Sub(ps.at) > s.stale {
			continue
		}
		p.EngineStats = &statusapi.EngineStats{
			Running:            ps.stats.Running,
			Waiting:            ps.stats.Waiting,
			KVCacheUsage:       ps.stats.KVCacheUsage,
			PrefixCacheHitRate: ps.hitRate(),
			SleepLevel:         ps.stats.SleepLevel,
			SampledAt:          ps.at,
		}
	}
}

// hitRate is the share of prefix-cache queries that hit over the window,
// the engine's own rate when it reports one instead, or nil when neither
// is known (no query in the window).
func (ps *state) hitRate() *float64 {
	if ps.stats.HasPrefixHitRate {
		r := ps.stats.PrefixHitRate
		return &r
	}
	first, last := ps.points[0], ps.points[len(ps.points)-1]
	if dq := last.queries - first.queries; dq > 0 {
		r := (last.hits - first.hits) / dq
		return &r
	}
	return nil
}
