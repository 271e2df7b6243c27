package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// restartProfiles renders workload 5r's profiles file: n pools, each
// preloading a simulator of its own that loads in load.
func restartProfiles(n int, load time.Duration) []byte {
	var ps, profs []map[string]any
	for i := range n {
		id := "r" + strconv.Itoa(i)
		ps = append(ps, map[string]any{"name": "p-" + id, "gpus": []int{i}, "default": id})
		profs = append(profs, map[string]any{"id": id, "pools": []string{"p-" + id},
			"command": []string{"{poold}", "engine-sim", "/models/{id}", "--port", "{port}", "--served-model-name", "{id}", "--sim-load-delay", load.String()}})
	}
	b, _ := json.MarshalIndent(map[string]any{"pools": ps, "profiles": profs,
		"defaults": map[string]any{"stopTimeout": "10s", "startupTimeout": "1m"}}, "", "  ")
	return b
}

// w5r: a restart of a poold with n loaded pools, timed from the new
// poold's start until one request to each pool has been answered: with
// keep-engines-on-restart (the engines adopted) against without (every
// pool loads again, which the simulators' load delay stands for). Each
// side restarts the same way o.rounds times; the medians are compared.
func (b *bench) w5r(ctx context.Context) error {
	n, load := b.o.pools5r, b.o.load5w
	profs := restartProfiles(n, load)
	models := make([]string, n)
	for i := range models {
		models[i] = "r" + strconv.Itoa(i)
	}
	var adopted, reloaded []float64
	for _, keep := range []bool{false, true} {
		name := "poold5r-" + map[bool]string{true: "keep", false: "reload"}[keep]
		flags := []string{"--keep-engines-on-restart=" + strconv.FormatBool(keep)}
		p, err := startPoold(b.dir, name, b.bin, profs, flags...)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = waitPoolsReady(wctx, p)
		cancel()
		for round := 0; err == nil && round < b.o.rounds; round++ {
			p.stop()
			t := time.Now()
			if p, err = startPoold(b.dir, name, b.bin, profs, flags...); err != nil {
				break
			}
			if err = serveAll(ctx, p.base, models); err != nil {
				break
			}
			took := time.Since(t)
			logf(b.logw, "  restart %d (keep-engines-on-restart=%v): every pool served after %v", round+1, keep, took)
			if keep {
				adopted = append(adopted, took.Seconds())
			} else {
				reloaded = append(reloaded, took.Seconds())
			}
		}
		p.stop()
		if keep {
			out, serr := exec.Command(b.bin, "stop-engines", "--state-dir", filepath.Join(b.dir, name+"-state")).CombinedOutput()
			if serr != nil {
				b.rep.problem("5r: poold stop-engines: %v: %s", serr, out)
			}
		}
		if err != nil {
			return err
		}
	}
	on, off := median(adopted), median(reloaded)
	b.rep.add(fmt.Sprintf("5r (%d loaded pools, load %v)", n, load), "restart with N loaded pools: time until every pool serves (adoption off │ on)",
		ms(off), ms(on), fmt.Sprintf("%.1f× faster", off/on), "below one load", ptr(on < load.Seconds()))
	return nil
}

// serveAll sends one request to each model at once, each retried until
// it is answered (the new poold may not listen yet), within a minute.
func serveAll(ctx context.Context, base string, models []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c := newClient(len(models))
	defer c.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make([]error, len(models))
	for i, m := range models {
		wg.Go(func() {
			for {
				s := do(ctx, c, base, chat(m, 1, false))
				if s.err == nil {
					return
				}
				if ctx.Err() != nil {
					errs[i] = fmt.Errorf("%s not served after the restart: %w", m, s.err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
