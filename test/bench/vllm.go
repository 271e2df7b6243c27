package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/poold/poold/internal/pool"
)

// Workloads 1v and 5v run poold in front of real engines: vLLM's CPU build
// (scripts/install-vllm.sh) serving the tiny models of
// test/e2e/make_models.py (2 layers, hidden 128, random weights). They run
// only when -vllm names the install. The figures are poold's overhead on a
// real engine's start, stop and HTTP server, not serving speed.

// vllmWorkloads are the workloads that run real engines.
var vllmWorkloads = []string{"1v", "5v"}

// vllmPool is the pool of the poold that fronts the real engines; it holds
// vllmModels, each served under its directory's name, and preloads the
// first.
const vllmPool = "vllm"

var vllmModels = []string{"llama", "qwen"}

// vllmEnv is the environment every real engine gets on top of what it
// inherits, poold's and those started directly: a 1 GiB KV cache, nothing
// fetched, no usage report.
var vllmEnv = map[string]string{
	"VLLM_CPU_KVCACHE_SPACE": "1",
	"HF_HUB_OFFLINE":         "1",
	"VLLM_NO_USAGE_STATS":    "1",
	"DO_NOT_TRACK":           "1",
}

// vllmStart bounds a real engine's start, and vllmStop its stop, directly and
// in poold (startupTimeout, stopTimeout): a start takes 40–80 s on two busy
// cores, a stop about 2 s.
const (
	vllmStart = 5 * time.Minute
	vllmStop  = 30 * time.Second
)

// realVLLM is the real-engine workloads' install, models and poold, which is
// started on first use and shared by them.
type realVLLM struct {
	python string // the virtual environment's python
	models string // the directory make_models.py wrote
	poold  *proc
}

// vllm returns the real-engine setup, making the models on first use into
// $POOLD_VLLM_MODELS (by default DIR/models, as the real-vLLM suite does)
// unless they are there, and starting the poold that fronts them.
func (b *bench) vllm(ctx context.Context) (*realVLLM, error) {
	if b.real != nil {
		return b.real, nil
	}
	python := filepath.Join(b.o.vllm, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		return nil, fmt.Errorf("-vllm %s is not a vLLM install (scripts/install-vllm.sh makes one): %w", b.o.vllm, err)
	}
	models := os.Getenv("POOLD_VLLM_MODELS")
	if models == "" {
		models = filepath.Join(b.o.vllm, "models")
	}
	if err := makeModels(ctx, b, python, models); err != nil {
		return nil, err
	}
	v := &realVLLM{python: python, models: models}
	p, err := startPoold(b.dir, "poold-vllm", b.bin, v.profiles())
	if err != nil {
		return nil, err
	}
	v.poold, b.real = p, v
	logf(b.logw, "poold-vllm: loading %s (vLLM, about a minute)", vllmModels[0])
	wctx, cancel := context.WithTimeout(ctx, vllmStart)
	defer cancel()
	return v, waitPoolsReady(wctx, p)
}

// makeModels runs test/e2e/make_models.py into dir unless it has done so.
func makeModels(ctx context.Context, b *bench, python, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, ".made")); err == nil {
		return nil
	}
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("finding the module root: %w", err)
	}
	script := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "test", "e2e", "make_models.py")
	logf(b.logw, "making the tiny models into %s", dir)
	cmd := exec.CommandContext(ctx, python, script, dir)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_HUB_DISABLE_PROGRESS_BARS=1", "TQDM_DISABLE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("making the models: %w\n%s", err, out)
	}
	return nil
}

// argv is the engine's command line: the OpenAI API server module, since
// the CPU build's `vllm` script is broken.
func (v *realVLLM) argv(model, port, id string) []string {
	return []string{v.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
		"--host", "127.0.0.1", "--port", port, "--served-model-name", id, "--max-model-len", "2048", "--dtype", "float32"}
}

// profiles renders the poold's profiles file: pool vllmPool with no minimum
// residency, a profile per model whose command is argv.
func (v *realVLLM) profiles() []byte {
	var profs []map[string]any
	for _, id := range vllmModels {
		profs = append(profs, map[string]any{"id": id, "model": filepath.Join(v.models, id), "pools": []string{vllmPool},
			"command": v.argv("{model}", "{port}", "{id}"), "env": vllmEnv})
	}
	b, _ := json.MarshalIndent(map[string]any{
		"pools":    []map[string]any{{"name": vllmPool, "gpus": []int{0}, "default": vllmModels[0], "minResidency": "0s"}},
		"profiles": profs,
		"defaults": map[string]any{"startupTimeout": vllmStart.String(), "stopTimeout": vllmStop.String()},
	}, "", "  ")
	return b
}

// startDirect starts model id's engine directly, as poold would, on a free
// port.
func (v *realVLLM) startDirect(dir, id string) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	env := os.Environ()
	for k, val := range vllmEnv {
		env = append(env, k+"="+val)
	}
	argv := v.argv(filepath.Join(v.models, id), strconv.Itoa(port), id)
	p, err := startEnv(dir, "vllm-"+id, argv[0], env, argv[1:]...)
	if err != nil {
		return nil, err
	}
	p.base = "http://127.0.0.1:" + strconv.Itoa(port)
	return p, nil
}

// ownTimes starts model id's engine directly and returns how long it took to
// list id on /v1/models, and then for its whole process group (the API
// server, its resource tracker, EngineCore and Worker) to exit after SIGTERM.
func (v *realVLLM) ownTimes(ctx context.Context, dir, id string) (start, stop time.Duration, err error) {
	t := time.Now()
	p, err := v.startDirect(dir, id)
	if err != nil {
		return 0, 0, err
	}
	defer stopGroup(p)
	wctx, cancel := context.WithTimeout(ctx, vllmStart)
	defer cancel()
	if err := waitModels(wctx, p, id); err != nil {
		return 0, 0, err
	}
	start = time.Since(t)
	t = time.Now()
	if err := stopGroup(p); err != nil {
		return 0, 0, err
	}
	return start, time.Since(t), nil
}

// stop stops the poold and then any of its engine's processes left.
func (v *realVLLM) stop() error {
	e, err := poolEngine(v.poold.base, vllmPool)
	v.poold.stopWithin(vllmStart)
	if err != nil {
		return nil // no engine: nothing left behind
	}
	return reapGroup(e.PID)
}

// stopGroup stops p and waits until every process of its group has exited.
func stopGroup(p *proc) error {
	p.stopWithin(vllmStop)
	return reapGroup(p.pid())
}

// reapGroup waits until process group pgid has no live member, sending it
// SIGKILL after vllmStop.
func reapGroup(pgid int) error {
	deadline := time.Now().Add(vllmStop)
	killed := false
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			if killed {
				return fmt.Errorf("process group %d still alive after SIGKILL", pgid)
			}
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killed, deadline = true, time.Now().Add(5*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// groupAlive reports whether a process of group pgid is alive (not a
// zombie).
func groupAlive(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:])) // state, ppid, pgrp, …
		if len(f) > 2 && f[0] != "Z" && f[0] != "X" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// vllmChat is a chat completion of exactly n tokens for model: the models'
// weights are random, so without ignore_eos they may stop at once.
func vllmChat(model string, n int) shape {
	b := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there, how are you today?"}],"max_tokens":%d,"ignore_eos":true}`, model, n)
	return shape{path: "/v1/chat/completions", body: []byte(b)}
}

// w5v: swaps on real engines. The pool alternates between the two models,
// each swap one request for the other, timed end to end, sent once
// pool.DefaultIdleGrace has passed (as in workload 5). Beside each, the
// target's engine is started and stopped directly, on the same machine at
// the same load (the pool's engine loaded and idle): before the swap for the
// first pair of swaps, after it for the next pair, and so on, so that each
// direction has both orders. Overhead = swap − start, the median over swaps;
// less the engine's own stop, what is left is poold's. The swap's phases
// (poold_swap_duration_seconds, scraped around each swap) give the time
// outside them: the scheduling, the proxying of the request and its 1-token
// answer.
func (b *bench) w5v(ctx context.Context) error {
	v, err := b.vllm(ctx)
	if err != nil {
		return err
	}
	e, err := poolEngine(v.poold.base, vllmPool)
	if err != nil {
		return err
	}
	first, err := scrape(v.poold.base, "poold_swap_duration_seconds")
	if err != nil {
		return err
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	loaded, lastUse := e.Profile, time.Now()
	var swaps, starts, stops, over, own, outside []float64
	for i := range 2 * b.o.swapsVLLM {
		target := vllmModels[0]
		if loaded == target {
			target = vllmModels[1]
		}
		var st, sp time.Duration
		direct := func() (err error) {
			st, sp, err = v.ownTimes(ctx, b.dir, target)
			return err
		}
		directFirst := i/2%2 == 0
		if directFirst {
			if err := direct(); err != nil {
				return err
			}
		}
		if err := sleepCtx(ctx, time.Until(lastUse.Add(pool.DefaultIdleGrace+50*time.Millisecond))); err != nil {
			return err
		}
		before, err := scrape(v.poold.base, "poold_swap_duration_seconds_sum")
		if err != nil {
			return err
		}
		s := do(ctx, c, v.poold.base, vllmChat(target, 1))
		lastUse = time.Now()
		if s.err != nil {
			b.rep.problem("5v: swap to %s failed: %v", target, s.err)
			return nil
		}
		after, err := scrape(v.poold.base, "poold_swap_duration_seconds_sum")
		if err != nil {
			return err
		}
		if !directFirst {
			if err := direct(); err != nil {
				return err
			}
		}
		sel := `pool="` + vllmPool + `"`
		phases := sumMatching(after, sel) - sumMatching(before, sel)
		logf(b.logw, "  swap %s → %s: %v, its phases %.3fs (its engine's own start %v, stop %v)", loaded, target,
			s.lat.Round(time.Millisecond), phases, st.Round(time.Millisecond), sp.Round(time.Millisecond))
		swaps, starts, stops = append(swaps, s.lat.Seconds()), append(starts, st.Seconds()), append(stops, sp.Seconds())
		over, own = append(over, (s.lat-st).Seconds()), append(own, (s.lat-st-sp).Seconds())
		outside = append(outside, s.lat.Seconds()-phases)
		loaded = target
	}
	last, err := scrape(v.poold.base, "poold_swap_duration_seconds")
	if err != nil {
		return err
	}
	w := "5v (vLLM " + strings.Join(vllmModels, " ⇄ ") + ")"
	b.rep.add(w, fmt.Sprintf("swap p50 (%d swaps) vs the engine's own start p50", len(swaps)),
		ms(median(starts)), ms(median(swaps)), plus(median(over), ms), "", nil)
	b.rep.add(w, "the engine's own stop p50 (SIGTERM to its group's exit)", ms(median(stops)), "", "", "", nil)
	b.rep.add(w, "overhead less the engine's own stop p50 (swap − start − stop)", "", "", plus(median(own), ms), "", nil)
	b.rep.add(w, "phases, mean ms (poold_swap_duration_seconds)", "", swapPhases(first, last, vllmPool), "", "", nil)
	b.rep.add(w, "swap − its phases p50 (scheduling, the request and its answer)", "", ms(median(outside)), "", "", nil)
	return nil
}

// noVLLM is why the real-engine workloads were skipped.
const noVLLM = "they need vLLM's CPU build: give -vllm DIR or set POOLD_VLLM_HOME (scripts/install-vllm.sh installs it, 6 GB)"
