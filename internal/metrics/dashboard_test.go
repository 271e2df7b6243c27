package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// exported gathers the name of every series poold exports, histogram
// suffixes included, from a registry with every collector carrying data.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg, _ := newLoaded(t, twoGPUs)
	NewTenantsReload(reg).Loaded(true, time.Unix(1700000000, 0)) // registered with a tenants file
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool)
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if len(mf.GetMetric()) > 0 && mf.GetMetric()[0].Histogram != nil {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	return names
}

var (
	// identRE finds PromQL identifiers (metric, label and function names).
	identRE = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// recordRE finds the recording rules' names in the rules file.
	recordRE = regexp.MustCompile(`(?m)^\s*- record:\s*(\S+)\s*$`)
)

// metricNames returns the poold metric names used in a PromQL expression:
// poold_* names, and recording-rule names (level:poold_…:ops).
func metricNames(expr string) []string {
	var out []string
	for _, id := range identRE.FindAllString(expr, -1) {
		if strings.Contains(id, "poold_") {
			out = append(out, id)
		}
	}
	return out
}

// queries walks a Grafana dashboard and returns every PromQL string in it:
// panel targets' expr and template variables' queries.
func queries(v any, key string, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			queries(c, k, out)
		}
	case []any:
		for _, c := range v {
			queries(c, key, out)
		}
	case string:
		if key == "expr" || key == "query" || key == "definition" {
			*out = append(*out, v)
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every metric the dashboard queries is one poold exports, or a recording
// rule of poold-rules.yml whose own inputs poold exports.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	names := exported(t)
	rules := string(readFile(t, "../../deploy/prometheus/poold-rules.yml"))
	records := make(map[string]bool)
	for _, m := range recordRE.FindAllStringSubmatch(rules, -1) {
		records[m[1]] = true
	}
	if len(records) == 0 {
		t.Fatal("no recording rules found in poold-rules.yml")
	}
	var dash map[string]any
	if err := json.Unmarshal(readFile(t, "../../deploy/grafana/poold-dashboard.json"), &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	var exprs []string
	queries(dash, "", &exprs)
	used := 0
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			used++
			if !names[n] && !records[n] {
				t.Errorf("dashboard query %q uses %s, which poold does not export and no recording rule defines", e, n)
			}
		}
	}
	if used < 15 {
		t.Fatalf("only %d metric references found in the dashboard's %d queries; is the walk broken?", used, len(exprs))
	}
}

// Every poold metric the rules file reads is one poold exports. The usage
// ledger's (poold_usage_*) are registered by internal/usage, which imports
// this package: its TestRulesUseLedgerMetrics checks them.
func TestRulesUseExportedMetrics(t *testing.T) {
	names := exported(t)
	rules := string(readFile(t, "../../deploy/prometheus/poold-rules.yml"))
	records := make(map[string]bool)
	for _, m := range recordRE.FindAllStringSubmatch(rules, -1) {
		records[m[1]] = true
	}
	exprRE := regexp.MustCompile(`(?s)expr:\s*(\|\n(?:\s{10}.*?\n)+|.*?\n)`)
	n := 0
	for _, m := range exprRE.FindAllStringSubmatch(rules, -1) {
		for _, name := range metricNames(m[1]) {
			n++
			if strings.HasPrefix(name, "poold_usage_") {
				continue
			}
			if !names[name] && !records[name] {
				t.Errorf("rule expression %q uses %s, which poold does not export", strings.TrimSpace(m[1]), name)
			}
		}
	}
	if n < 12 {
		t.Fatalf("only %d metric references found in the rules; is the parse broken?", n)
	}
}
