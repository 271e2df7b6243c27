package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/statusapi"
)

// status prints a running fleetd's fleet view: a table, or its JSON. It exits
// 0, 1 when fleetd cannot be asked, 2 on a usage error.
func status(args []string, stdout, stderr io.Writer) int {
	cmd := cli.StatusCommand[statusapi.Fleetd]{Daemon: "fleetd", AddrEnv: "FLEETD_ADDR", DefaultAddr: "127.0.0.1:8090", Print: printStatus}
	return cmd.Run(args, stdout, stderr)
}

// printStatus writes one row per pool of every host, with the host's last
// error. An ejected host gets one row, without the pools of its last good
// poll.
func printStatus(out io.Writer, st statusapi.Fleetd) {
	fmt.Fprintf(out, "fleetd %s, hosts file %s", st.Version, st.HostsFile.Path)
	if st.HostsFile.LastError != nil {
		fmt.Fprintf(out, " (last reload refused: %s)", firstLine(*st.HostsFile.LastError))
	}
	fmt.Fprintln(out)
	if tf, limits := st.TenantsFile, st.TenantLimits; tf != nil && limits != nil {
		mode, refused := "fail-open", "let through unchecked"
		if limits.FailClosed {
			mode, refused = "fail-closed", "refused"
		}
		fmt.Fprintf(out, "tenants file %s, limits in %s", tf.Path, limits.Store)
		if limits.Store != "memory" {
			fmt.Fprintf(out, " (%s)", mode)
		}
		if !limits.Reachable {
			fmt.Fprintf(out, ", unreachable: requests %s", refused)
		}
		if tf.LastError != nil {
			fmt.Fprintf(out, " (last reload refused: %s)", firstLine(*tf.LastError))
		}
		fmt.Fprintln(out)
		for _, d := range limits.Disagreements {
			fmt.Fprintf(out, "tenant %s: limits %s here, %s at replica %s (buckets of their own: the tenants files differ)\n", d.Tenant, d.Ours, d.Limits, d.Replica)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tHEALTH\tPOOL\tSTATE\tPROFILE\tSWITCHING\tIN FLIGHT\tWAITING\tPOLL\tLAST ERROR")
	for _, h := range st.Hosts {
		health := "up"
		switch {
		case h.Ejected:
			health = "ejected"
		case !h.Healthy:
			health = "unknown"
		case !h.Reachable:
			health = "failing"
		}
		poll := "-"
		if h.LastPoll != nil {
			poll = strconv.FormatFloat(h.PollLatencyMs, 'f', 1, 64) + "ms"
		}
		lastErr := "-"
		if h.LastError != nil {
			lastErr = firstLine(*h.LastError)
		}
		if len(h.Pools) == 0 || h.Ejected {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t%s\t%s\n", h.Name, health, poll, lastErr)
			continue
		}
		for _, p := range h.Pools {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", h.Name, health, p.Name, p.State,
				orDash(p.Profile), orDash(p.SwitchingTo), p.InFlight, waiting(p.Waiting), poll, lastErr)
		}
	}
	_ = tw.Flush()
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// waiting renders a pool's waiters by profile: "qwen:2,llama:1", or "0".
func waiting(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+":"+strconv.Itoa(m[k]))
	}
	return strings.Join(parts, ",")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
