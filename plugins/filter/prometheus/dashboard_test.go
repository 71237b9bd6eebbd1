package prometheus_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// dashboardPath is the Grafana dashboard built on this filter's metrics.
const dashboardPath = "../../../docs/grafana/kernrpc.json"

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"` // a string, or {query: ...}
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// queries are the PromQL expressions of the dashboard's panels and
// variables, by where they are.
func (d *dashboard) queries() map[string]string {
	q := map[string]string{}
	for _, p := range d.Panels {
		for i, t := range p.Targets {
			q[p.Title+"#"+string(rune('A'+i))] = t.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue // a data source picker, not a query
		}
		switch s := v.Query.(type) {
		case string:
			q["variable "+v.Name] = s
		case map[string]any:
			if s, ok := s["query"].(string); ok {
				q["variable "+v.Name] = s
			}
		}
	}
	return q
}

var metricName = regexp.MustCompile(`\b(?:kernrpc|go|process)_[a-zA-Z0-9_]+\b|\bup\b`)

// Every metric the dashboard's queries use is one a real scrape has, and
// every kernrpc family the filter exposes has a panel.
func TestDashboardUsesScrapedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	var titles []string
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		titles = append(titles, p.Title)
	}

	_, cli, sf, cf := echoService(t, governedYAML)
	burst(t, cli, 5)
	chatBurst(t, cli, 2, 3)
	_, fams := scrape(t, serve(t, sf.Handler()))
	_, cfams := scrape(t, serve(t, cf.Handler()))
	for k, v := range cfams {
		fams[k] = v
	}
	exists := func(name string) bool {
		if name == "up" { // Prometheus makes it for every target it scrapes
			return true
		}
		if _, ok := fams[name]; ok {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f, ok := fams[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && f.GetType() == dto.MetricType_HISTOGRAM {
				return true
			}
		}
		return false
	}
	used := map[string]bool{}
	queries := d.queries()
	for where, q := range queries {
		names := metricName.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("%s: query %q names no metric this test knows", where, q)
		}
		for _, n := range names {
			if !exists(n) {
				t.Errorf("%s: query uses %s, which the scrape does not have", where, n)
			}
			used[n] = true
		}
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "kernrpc_") {
			continue
		}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			name += "_bucket"
		}
		if !used[name] {
			t.Errorf("no panel of the dashboard shows %s", name)
		}
	}
	for _, want := range []string{"histogram_quantile(0.5,", "histogram_quantile(0.99,"} {
		if !slices.ContainsFunc(slices.Collect(mapValues(queries)), func(q string) bool { return strings.Contains(q, want) }) {
			t.Errorf("no query computes %s...)", want)
		}
	}
	checkPromQL(t, queries)
	t.Logf("%d panels: %s", len(titles), strings.Join(titles, "; "))
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// checkPromQL has promtool parse every panel query, as recording rules,
// with Grafana's variables replaced by what they stand for.
func checkPromQL(t *testing.T, queries map[string]string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if requireTools() {
			t.Fatalf("promtool is not installed, and CI or KERNRPC_REQUIRE_TOOLS requires it: %v", err)
		}
		t.Logf("promtool is not installed: the queries' syntax is not checked")
		return
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range queries {
			if !strings.HasPrefix(k, "variable ") && !yield(k) {
				return
			}
		}
	})
	for i, k := range keys {
		expr, _ := json.Marshal(vars.Replace(queries[k])) // JSON strings are YAML strings
		rules.WriteString("      - record: dashboard:query" + string(rune('a'+i%26)) + strings.Repeat("x", i/26) + "\n        expr: " + string(expr) + "\n")
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s\n%s", err, out, rules.String())
	}
}
