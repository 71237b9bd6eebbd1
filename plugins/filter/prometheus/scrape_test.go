package prometheus_test

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape is one GET of /metrics over real HTTP, in the text format a
// plain scraper negotiates, returning the body and its parsed families.
func scrape(t testing.TB, url string) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	body := get(t, url, "")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing %s: %v\n%s", url, err, body)
	}
	return body, fams
}

// get fetches url with an Accept header (none if empty) on a connection
// of its own, closed after, so that no keep-alive goroutine outlives it.
func get(t testing.TB, url, accept string) []byte {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return body
}

// serve serves h on a real HTTP server for the test's lifetime and
// returns the URL of its /metrics.
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// labels is a set of label values a series must have.
type labels map[string]string

func (l labels) match(m *dto.Metric) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := l[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(l)
}

// series returns the series of family name matching want, failing if
// there is not exactly one.
func series(t testing.TB, fams map[string]*dto.MetricFamily, name string, want labels) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no family %s in the scrape", name)
	}
	var found []*dto.Metric
	for _, m := range f.GetMetric() {
		if want.match(m) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d series match, want 1 (family: %v)", name, want, len(found), f)
	}
	return found[0]
}

// value is a counter's or a gauge's value, a histogram's count.
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, want labels) float64 {
	t.Helper()
	m := series(t, fams, name, want)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s%v: neither counter, gauge nor histogram", name, want)
	return math.NaN()
}

// checkHistogram checks a histogram series counted n observations:
// buckets cumulative, the last (+Inf, implicit in the text format) equal
// to the count.
func checkHistogram(t testing.TB, fams map[string]*dto.MetricFamily, name string, want labels, n uint64) {
	t.Helper()
	h := series(t, fams, name, want).GetHistogram()
	if h.GetSampleCount() != n {
		t.Errorf("%s%v: count %d, want %d", name, want, h.GetSampleCount(), n)
	}
	var prev uint64
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() < prev {
			t.Errorf("%s%v: bucket le=%g holds %d, less than the one below (%d)", name, want, b.GetUpperBound(), b.GetCumulativeCount(), prev)
		}
		prev = b.GetCumulativeCount()
		if math.IsInf(b.GetUpperBound(), 1) && b.GetCumulativeCount() != n {
			t.Errorf("%s%v: +Inf bucket %d, want %d", name, want, b.GetCumulativeCount(), n)
		}
	}
	if prev > n {
		t.Errorf("%s%v: top bucket %d over the count %d", name, want, prev, n)
	}
	if n > 0 && !(h.GetSampleSum() > 0) {
		t.Errorf("%s%v: sum %g after %d calls", name, want, h.GetSampleSum(), n)
	}
}

// promtool runs `promtool check metrics` on a scrape and fails on any
// finding. Without promtool the test is skipped, unless CI=1 (or true) or
// KERNRPC_REQUIRE_TOOLS=1 says the tools must be there: then it fails.
func promtool(t *testing.T, body []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if requireTools() {
			t.Fatalf("promtool is not installed, and CI or KERNRPC_REQUIRE_TOOLS requires it (Debian: apt-get install prometheus): %v", err)
		}
		t.Skipf("promtool is not installed (Debian: apt-get install prometheus); set KERNRPC_REQUIRE_TOOLS=1 to fail instead: %v", err)
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

func requireTools() bool {
	ci := strings.ToLower(os.Getenv("CI"))
	return ci == "1" || ci == "true" || os.Getenv("KERNRPC_REQUIRE_TOOLS") == "1"
}
