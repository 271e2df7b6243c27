package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the whole harness with tiny counts, so that it cannot rot. It
// checks correctness only, never speed: every request of every workload
// succeeded, poold counted the usage of every stream and withheld the usage
// chunk it asked for, non-streaming answers carried usage, and every
// workload produced its rows.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds poold and runs real processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log bytes.Buffer
	rep, err := run(ctx, smoke(), &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	for _, p := range rep.problems {
		t.Errorf("problem: %s", p)
	}
	seen := map[string]bool{}
	for _, r := range rep.rows {
		seen[strings.Fields(r.workload)[0]] = true
		if r.metric == "usage counted by poold" && r.met != "yes" {
			t.Errorf("usage not counted: %s", r.poold)
		}
	}
	for _, w := range []string{"1", "1f", "1t", "2", "2m", "2u", "2s", "3", "4", "4b", "5", "5a", "5w", "5r", "6"} {
		if !seen[w] {
			t.Errorf("no rows for workload %s", w)
		}
	}
	if t.Failed() {
		var out bytes.Buffer
		rep.print(&out)
		t.Logf("table:\n%s\nlog:\n%s", out.String(), log.String())
	}
}
