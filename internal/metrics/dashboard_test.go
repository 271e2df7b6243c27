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
// suffixes included, from a registry with every collector carrying data,
// with the names of its labels.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg, _ := newLoaded(t, twoGPUs)
	NewTenantsReload(reg).Loaded(true, time.Unix(1700000000, 0)) // registered with a tenants file
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]map[string]bool)
	for _, mf := range mfs {
		n := mf.GetName()
		labels := make(map[string]bool)
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		names[n] = labels
		if len(mf.GetMetric()) > 0 && mf.GetMetric()[0].Histogram != nil {
			bucket := map[string]bool{"le": true}
			for l := range labels {
				bucket[l] = true
			}
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = bucket, labels, labels
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
			if _, ok := names[n]; !ok && !records[n] {
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
	records := make(map[string]bool)
	all := rules(t)
	for _, r := range all {
		records[r.name] = r.record
	}
	n := 0
	for _, r := range all {
		for _, name := range metricNames(r.expr) {
			n++
			if strings.HasPrefix(name, "poold_usage_") {
				continue
			}
			if _, ok := names[name]; !ok && !records[name] {
				t.Errorf("rule expression %q uses %s, which poold does not export", strings.TrimSpace(r.expr), name)
			}
		}
	}
	if n < 12 {
		t.Fatalf("only %d metric references found in the rules; is the parse broken?", n)
	}
}

var (
	// groupingRE finds the label lists of by, without, on and ignoring.
	groupingRE = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	// matcherRE finds label matchers' label names inside a selector's braces.
	matcherRE   = regexp.MustCompile(`\{([^}]*)\}`)
	matchNameRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	// legendRE finds the labels a Grafana legend prints; annotationRE, those
	// an alert's annotations print.
	legendRE     = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	annotationRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	// ruleRE starts each rule of the rules file.
	ruleRE = regexp.MustCompile(`(?m)^\s*- (?:alert|record):\s*(\S+)\s*$`)
)

// labelChecker says which labels the series of poold, and of its recording
// rules, carry.
type labelChecker struct {
	series  map[string]map[string]bool
	records map[string]map[string]bool // by the labels its expression keeps
}

func newLabelChecker(t *testing.T) *labelChecker {
	t.Helper()
	c := &labelChecker{series: exported(t), records: map[string]map[string]bool{}}
	for _, r := range rules(t) {
		if r.record {
			kept := map[string]bool{}
			if m := groupingRE.FindStringSubmatch(r.expr); m != nil {
				for _, l := range strings.Split(m[1], ",") {
					kept[strings.TrimSpace(l)] = true
				}
			}
			c.records[r.name] = kept
		}
	}
	return c
}

// available returns the labels the series that expr reads may carry, those
// Prometheus adds on a scrape (instance, job) included; ok is false when
// expr reads a series this package does not export (the usage ledger's).
func (c *labelChecker) available(expr string) (labels map[string]bool, ok bool) {
	labels = map[string]bool{"instance": true, "job": true}
	names := metricNames(expr)
	for _, n := range names {
		ls, found := c.series[n]
		if !found {
			ls, found = c.records[n]
		}
		if !found {
			return nil, false
		}
		for l := range ls {
			labels[l] = true
		}
	}
	return labels, len(names) > 0
}

// used returns the labels expr groups, joins or matches on.
func used(expr string) []string {
	var out []string
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, m := range matcherRE.FindAllStringSubmatch(expr, -1) {
		for _, n := range matchNameRE.FindAllStringSubmatch(m[1], -1) {
			out = append(out, n[1])
		}
	}
	return out
}

type rule struct {
	name, expr, text string // text: the whole rule, its annotations included
	record           bool
}

// rules splits poold-rules.yml into its rules.
func rules(t *testing.T) []rule {
	t.Helper()
	file := string(readFile(t, "../../deploy/prometheus/poold-rules.yml"))
	exprRE := regexp.MustCompile(`(?s)expr:\s*(\|\n(?:\s{10}.*?\n)+|.*?\n)`)
	starts := ruleRE.FindAllStringSubmatchIndex(file, -1)
	var out []rule
	for i, s := range starts {
		end := len(file)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		text := file[s[0]:end]
		r := rule{name: file[s[2]:s[3]], text: text, record: strings.Contains(file[s[0]:s[1]], "- record:")}
		if m := exprRE.FindStringSubmatch(text); m != nil {
			r.expr = strings.TrimPrefix(m[1], "|")
		}
		out = append(out, r)
	}
	if len(out) < 20 {
		t.Fatalf("only %d rules found in poold-rules.yml; is the parse broken?", len(out))
	}
	return out
}

// Every label the rules and the dashboard group, join or match on, print
// in an annotation or a legend, is one that the series they read carry: a
// label renamed in poold cannot leave a rule silently aggregating it away.
func TestRulesAndDashboardUseExportedLabels(t *testing.T) {
	c := newLabelChecker(t)
	checked := 0
	for _, r := range rules(t) {
		avail, ok := c.available(r.expr)
		if !ok {
			continue
		}
		for _, l := range append(used(r.expr), matches(annotationRE, r.text)...) {
			checked++
			if !avail[l] {
				t.Errorf("rule %s uses label %s, which none of the series it reads carries", r.name, l)
			}
		}
	}
	var dash map[string]any
	if err := json.Unmarshal(readFile(t, "../../deploy/grafana/poold-dashboard.json"), &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	for _, target := range targets(dash) {
		expr, _ := target["expr"].(string)
		legend, _ := target["legendFormat"].(string)
		avail, ok := c.available(expr)
		if !ok {
			t.Errorf("dashboard query %q reads a series poold does not export", expr)
			continue
		}
		for _, l := range append(used(expr), matches(legendRE, legend)...) {
			checked++
			if !avail[l] {
				t.Errorf("dashboard query %q (legend %q) uses label %s, which none of the series it reads carries", expr, legend, l)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d label uses checked; is the parse broken?", checked)
	}
}

func matches(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// targets returns the dashboard's panel targets: the objects with an expr.
func targets(v any) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["expr"].(string); ok {
			return []map[string]any{v}
		}
		for _, c := range v {
			out = append(out, targets(c)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, targets(c)...)
		}
	}
	return out
}
