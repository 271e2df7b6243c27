// Command bench measures poold against the engine it fronts, in one run on one
// machine. It builds poold, starts the bundled simulator directly and poold
// with profiles that run the same simulator, runs each workload directly
// against the engine and through poold in alternating rounds, and prints one
// table of medians over the rounds with poold's ratio or added cost. Absolute
// figures on a shared 2-core machine are noise; the ratios are the result.
//
//	go run ./test/bench [-rounds 5] [-dur 2s] [-smoke] [-only 1,5] [-vllm DIR]
//
// Workloads 1v and 5v run real engines, vLLM's CPU build installed in DIR
// (scripts/install-vllm.sh; by default $POOLD_VLLM_HOME), and are skipped
// without it.
//
// docs/benchmarks.md keeps the latest table and what each figure means.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// options sizes a run. The zero value is not useful: see defaults and smoke.
type options struct {
	rounds    int           // rounds of each of workloads 1–4b, each side once per round
	dur       time.Duration // length of one side of one round of workloads 1–4
	dur4b     time.Duration // length of one side of one round of workload 4b
	streams4b int           // concurrent streams of workload 4b
	swaps     int           // swaps timed in workload 5
	swaps5w   int           // swaps of each kind (cold, wake) timed in workload 5w
	load5w    time.Duration // workload 5w's simulated cold load; a wake takes a fifteenth; also workload 5r's
	pools5r   int           // loaded pools of workload 5r
	requests6 int           // requests before the RSS figure of workload 6
	idle6     int           // concurrent slow streams of workload 6
	scale     bool          // run workload 7's Go benchmarks
	benchtime string        // -benchtime of the Go benchmarks run (7, 1t), each run 5 times but in smoke mode
	only      string        // comma-separated workloads to run; empty runs all
	vllm      string        // vLLM's CPU build, for workloads 1v and 5v; empty skips them
	swapsVLLM int           // swaps each way timed in workload 5v
}

func defaults() options {
	return options{rounds: 5, dur: 2 * time.Second, dur4b: 3 * time.Second, streams4b: 1000,
		swaps: 10, swaps5w: 5, load5w: 3 * time.Second, pools5r: 4, requests6: 100_000, idle6: 5000, scale: true, benchtime: "200ms",
		swapsVLLM: 2}
}

// smoke is a run of a few seconds that checks correctness, not speed.
func smoke() options {
	return options{rounds: 1, dur: 150 * time.Millisecond, dur4b: 300 * time.Millisecond, streams4b: 20,
		swaps: 1, swaps5w: 1, load5w: 150 * time.Millisecond, pools5r: 2, requests6: 200, idle6: 20, scale: false, benchtime: "100x",
		swapsVLLM: 1}
}

func main() {
	o := defaults()
	isSmoke := flag.Bool("smoke", false, "a run of a few seconds with tiny counts (correctness only)")
	flag.IntVar(&o.rounds, "rounds", o.rounds, "rounds of workloads 1–4b (each side once per round)")
	flag.DurationVar(&o.dur, "dur", o.dur, "length of one side of one round of workloads 1–4")
	flag.DurationVar(&o.dur4b, "dur4b", o.dur4b, "length of one side of one round of workload 4b")
	flag.IntVar(&o.streams4b, "streams", o.streams4b, "concurrent streams of workload 4b")
	flag.IntVar(&o.swaps, "swaps", o.swaps, "swaps timed in workload 5")
	flag.IntVar(&o.requests6, "requests", o.requests6, "requests before workload 6's RSS figure")
	flag.IntVar(&o.idle6, "idle-streams", o.idle6, "concurrent slow streams of workload 6")
	flag.BoolVar(&o.scale, "scale", o.scale, "run workload 7 (go test -bench in internal/pool and internal/profile)")
	flag.StringVar(&o.only, "only", "", "run only these workloads, comma-separated (1,1f,1c,1t,2,2m,2u,2s,3,4,4b,5,5a,5w,5r,6,7,1v,5v)")
	flag.StringVar(&o.vllm, "vllm", os.Getenv("POOLD_VLLM_HOME"), "vLLM's CPU build (scripts/install-vllm.sh), for workloads 1v and 5v; empty skips them")
	flag.IntVar(&o.swapsVLLM, "vllm-swaps", o.swapsVLLM, "swaps each way timed in workload 5v (each about 45 s, and as long again for the engine's own start)")
	flag.Parse()
	if *isSmoke {
		only, vllm := o.only, o.vllm
		o = smoke()
		o.only, o.vllm = only, vllm
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o, os.Stderr)
	if rep != nil {
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if len(rep.problems) > 0 {
		os.Exit(1)
	}
}
