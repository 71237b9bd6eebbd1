package prometheus_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
)

// metricsSection is the Metrics section of docs/observability.md, the
// part this filter owns: up to the next section of the same level.
func metricsSection(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal("docs/observability.md has no ## Metrics section")
	}
	sec := doc[start+1:]
	if end := strings.Index(sec[3:], "\n## "); end >= 0 {
		sec = sec[:end+3]
	}
	return sec
}

var fence = regexp.MustCompile("(?s)```(yaml|promql)\n(.*?)```")

// The section's config loads (its plugin names and options are checked
// as a config file's are), its queries parse, and its tables name every
// metric the filter exposes, and only those, apart from the planned ones.
func TestDocsMetricsSection(t *testing.T) {
	sec := metricsSection(t)
	queries := map[string]string{}
	for i, m := range fence.FindAllStringSubmatch(sec, -1) {
		switch m[1] {
		case "yaml":
			if _, err := kernrpc.ParseConfig([]byte(m[2]), "observability-metrics.yaml"); err != nil {
				t.Errorf("the config in docs/observability.md does not load: %v", err)
			}
		case "promql":
			for j, q := range strings.Split(strings.TrimSpace(m[2]), "\n") {
				queries[string(rune('a'+i))+string(rune('a'+j))] = q
			}
		}
	}
	if len(queries) == 0 {
		t.Error("no promql block in the Metrics section")
	}
	checkPromQL(t, queries)

	_, cli, sf, cf := echoService(t, governedYAML)
	burst(t, cli, 2)
	chatBurst(t, cli, 2, 3)
	_, fams := scrape(t, serve(t, sf.Handler()))
	_, cfams := scrape(t, serve(t, cf.Handler()))
	for k, v := range cfams {
		fams[k] = v
	}
	current, planned, _ := strings.Cut(sec, "### Planned metrics")
	for name := range fams {
		if strings.HasPrefix(name, "kernrpc_") || strings.HasPrefix(name, "promhttp_") {
			if !strings.Contains(current, "`"+name+"`") {
				t.Errorf("the Metrics section's table does not list %s", name)
			}
		}
	}
	for _, m := range regexp.MustCompile("\\| `(kernrpc_[a-z_]+)` \\|").FindAllStringSubmatch(current, -1) {
		if _, ok := fams[m[1]]; !ok {
			t.Errorf("the Metrics section lists %s, which the scrape does not have", m[1])
		}
	}
	for _, m := range regexp.MustCompile("\\| `(kernrpc_[a-z_]+)` \\|").FindAllStringSubmatch(planned, -1) {
		if _, ok := fams[m[1]]; ok {
			t.Errorf("%s is listed as planned but is already exposed", m[1])
		}
	}
}
