package pool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// DefaultHealthInterval is how often a serving engine's /health is polled
// (Options.HealthInterval).
const DefaultHealthInterval = 2 * time.Second

// watchHealth starts polling e's GET /health every Options.HealthInterval
// while it serves: vLLM answers 503 once its engine core is dead, and then
// answers every request with 500 until a watchdog ends it, or forever with
// VLLM_KEEP_ALIVE_ON_ENGINE_DEATH. On a 503 the engine fails
// (engineFailed): the run loop stops it and the next request starts a
// fresh one. Only the run loop calls it, once e is ready; unwatchHealth
// ends it.
func (p *Pool) watchHealth(e *engine) {
	interval := p.opts.HealthInterval
	if interval == 0 {
		interval = DefaultHealthInterval
	}
	if interval < 0 || e.unwatch != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.unwatch = cancel
	go func() {
		if err := e.pollHealth(ctx, interval); err != nil {
			p.engineFailed(e, err)
		}
	}()
}

// unwatchHealth ends e's /health polling, if any: before it sleeps or
// stops. Only the run loop calls it.
func (e *engine) unwatchHealth() {
	if e.unwatch != nil {
		e.unwatch()
		e.unwatch = nil
	}
}

// refusedPolls is how many polls in a row that find e's port refusing
// connections fail it: nothing listens there, whatever the report of its
// exit (a supervisor that could not send it, say).
const refusedPolls = 3

// pollHealth polls e's /health every interval, each probe bounded by the
// probe client's timeout, until ctx ends or the engine exits (nil), or it
// answers 503, or refusedPolls polls in a row find its port refusing
// connections (an error saying so, with the engine's reason and last
// output lines). Other answers and failed probes count for nothing: an
// exit is seen through the handle's Exited, and a slow answer is no proof
// of a dead core.
func (e *engine) pollHealth(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	refused := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.h.Exited():
			return nil
		case <-t.C:
		}
		status, err := e.api.Health(ctx)
		if errors.Is(err, syscall.ECONNREFUSED) {
			if refused++; refused == refusedPolls {
				return e.failedWith(fmt.Sprintf("failed: GET /health was refused %d times in a row: nothing listens on its port %d", refused, e.port))
			}
			continue
		}
		refused = 0
		if err != nil {
			continue
		}
		if status == http.StatusServiceUnavailable {
			return e.failedWith("failed over: GET /health answered " + strconv.Itoa(status) + " " + http.StatusText(status) + ": its engine core is dead")
		}
	}
}
