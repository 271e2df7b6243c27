package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/statusapi"
)

// status prints a running poold's GET /status as a table (or, with --json, as
// it came): exit 0, 1 when the daemon cannot be asked, 2 on a usage error.
// --addr defaults to POOLD_LISTEN, else 127.0.0.1:8080.
func status(args []string, stdout, stderr io.Writer) int {
	cmd := cli.StatusCommand[statusapi.Poold]{Daemon: "poold", AddrEnv: "POOLD_LISTEN", DefaultAddr: "127.0.0.1:8080", Print: printStatus}
	return cmd.Run(args, stdout, stderr)
}

// printStatus writes the daemon line, the profiles line (and the refused
// reload's errors, if any), then one row per pool (ENGINE: its engine's pid
// and what the engine reports running and waiting, and its KV cache use; ASLEEP: its
// sleeping engines, docs/sleep-mode.md; IDLE RELEASE: what its idle engine
// is due, docs/scheduling.md).
func printStatus(w io.Writer, st statusapi.Poold) {
	fmt.Fprintf(w, "poold %s on %s\n", st.Version, st.Host)
	c := st.Config
	fmt.Fprintf(w, "profiles %s (sha256 %.12s, loaded %s)\n", c.Path, c.SHA256, c.LoadedAt.UTC().Format(time.RFC3339))
	if c.LastError != nil {
		fmt.Fprintln(w, "last reload refused (the profiles above stay in force):")
		for _, line := range strings.Split(*c.LastError, "\n") {
			fmt.Fprintln(w, "  "+line)
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tGPUS\tSTATE\tPROFILE\tIN-FLIGHT\tWAITING\tENGINE\tASLEEP\tIDLE RELEASE\tLAST ERROR")
	for _, p := range st.Pools {
		gpus := make([]string, len(p.GPUs))
		for i, g := range p.GPUs {
			gpus[i] = strconv.Itoa(g)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Name, strings.Join(gpus, ","), p.State,
			profileCell(p.Profile, p.SwitchingTo), p.InFlight, waitingCell(p.Waiting), engineCell(p.Engine, p.EngineStats), sleepingCell(p.Sleeping),
			releaseCell(p.ReleaseAt, p.ReleaseAction), errorCell(p.LastError))
	}
	tw.Flush()
}

// profileCell is the loaded profile, "→ next" while one loads, or "-".
func profileCell(loaded, switching *string) string {
	switch {
	case loaded != nil && switching != nil:
		return *loaded + " → " + *switching
	case switching != nil:
		return "→ " + *switching
	case loaded != nil:
		return *loaded
	}
	return "-"
}

// waitingCell is the total waiting, with the count per profile: "3 (a:1 b:2)".
func waitingCell(waiting map[string]int) string {
	total := 0
	var by []string
	for _, id := range slices.Sorted(maps.Keys(waiting)) {
		total += waiting[id]
		by = append(by, fmt.Sprintf("%s:%d", id, waiting[id]))
	}
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(by, " "))
}

// engineCell is the pool's engine process and what it reports: "pid 4242,
// 12 run, 3 wait, KV 87%"; "pid 4242" alone until its first sample (as
// right after a swap), "pid 4242, loading" before it is ready, or "-"
// without an engine.
func engineCell(e *statusapi.Engine, st *statusapi.EngineStats) string {
	if e == nil {
		return "-"
	}
	cell := "pid " + strconv.Itoa(e.PID)
	switch {
	case e.ReadyAt == nil:
		cell += ", loading"
	case st != nil:
		cell += fmt.Sprintf(", %d run, %d wait, KV %.0f%%", st.Running, st.Waiting, st.KVCacheUsage*100)
	}
	return cell
}

// sleepingCell lists the pool's sleeping engines, least recently used
// first, each with its sleep level: "chat-small:L1 coder:L2", or "-".
func sleepingCell(sleeping []statusapi.Sleeper) string {
	if len(sleeping) == 0 {
		return "-"
	}
	cells := make([]string, len(sleeping))
	for i, sl := range sleeping {
		cells[i] = fmt.Sprintf("%s:L%d", sl.Profile, sl.Level)
	}
	return strings.Join(cells, " ")
}

// releaseCell is the idle release due: "sleep at 2025-06-01T12:10:10Z", or
// "-" when none is.
func releaseCell(at *time.Time, action string) string {
	if at == nil {
		return "-"
	}
	return action + " at " + at.UTC().Format(time.RFC3339)
}

// errorCell is the first line of the pool's last error, or "-".
func errorCell(err *string) string {
	if err == nil {
		return "-"
	}
	line, _, _ := strings.Cut(*err, "\n")
	return line
}
