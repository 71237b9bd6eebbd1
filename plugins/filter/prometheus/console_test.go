package prometheus_test

import (
	"context"
	"encoding/json"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc/kernel"
)

// consoleYAML is echoYAML with the admin address, where the engine serves
// its status console beside /metrics, and a token bucket refusing most
// calls of Echo.Fail before the filters' Invoke.
const consoleYAML = echoYAML + `  - {name: token-bucket, side: server, methods: [Echo.Fail], options: {rate: 0.001, burst: 5}}
server: {admin_address: 127.0.0.1:0}
`

// status is the part of the console's /status.json the test reads
// (docs/console.md).
type status struct {
	Summary struct {
		Calls       int64 `json:"calls"`
		Errors      int64 `json:"errors"`
		InFlight    int64 `json:"in_flight"`
		Connections int   `json:"connections"`
	} `json:"summary"`
	Methods []struct {
		Service string           `json:"service"`
		Method  string           `json:"method"` // the full name: Echo.Say
		Calls   int64            `json:"calls"`
		Errors  int64            `json:"errors"`
		Codes   map[string]int64 `json:"codes"`
	} `json:"methods"`
	Connections []struct {
		InFlight int `json:"in_flight"`
	} `json:"connections"`
	State []struct {
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		Readings []struct {
			Name   string            `json:"name"`
			Kind   string            `json:"kind"`
			Labels map[string]string `json:"labels"`
			Value  float64           `json:"value"`
		} `json:"readings"`
	} `json:"state"`
}

// notServed is how the console names the calls of methods the server
// does not serve.
const notServed = "(not served here)"

// The status console's JSON and the server's /metrics, both on the admin
// address, agree after a burst: per method and code the same calls
// (handled ones, and those the token bucket refused before Invoke), the
// same errors, nothing in flight, the same connections, and the same
// value for every state reading the console shows. By design they differ
// on one thing, asserted as such: calls of a method the server does not
// serve are counted by the console (as "(not served here)") and not by
// the filter, which the server tells of served methods' calls only.
func TestConsoleAgreesWithMetrics(t *testing.T) {
	const n = 40
	srv, cli, _, cf := echoService(t, consoleYAML)
	ctx := context.Background()
	refused := 0
	for i := 0; i < n; i++ {
		req := wrapperspb.String(strings.Repeat("x", i%7))
		if err := cli.Call(ctx, "Echo.Say", req, &wrapperspb.StringValue{}); err != nil {
			t.Fatalf("Echo.Say: %v", err)
		}
		switch err := cli.Call(ctx, "Echo.Fail", req, &wrapperspb.StringValue{}); kernel.CodeOf(err) {
		case kernel.FailedPrecondition:
		case kernel.ResourceExhausted:
			refused++
		default:
			t.Fatalf("Echo.Fail: %v, want FailedPrecondition or ResourceExhausted", err)
		}
	}
	const unserved = 3
	for i := 0; i < unserved; i++ {
		if err := cli.Call(ctx, "Echo.Nope", wrapperspb.String("x"), &wrapperspb.StringValue{}); kernel.CodeOf(err) != kernel.Unimplemented {
			t.Fatalf("Echo.Nope: %v, want Unimplemented", err)
		}
	}
	if refused == 0 || refused == n {
		t.Fatalf("%d of %d calls of Echo.Fail refused: the bucket should refuse some, not all", refused, n)
	}
	// Every attempt the client made is one answer the server wrote (a
	// refused call the client retried is several).
	_, cfams := scrape(t, serve(t, cf.Handler()))
	answers := int64(sumOf(cfams, "kernrpc_client_attempts_total", labels{}))

	base := "http://" + srv.AdminAddr()
	// Both count a call just after its answer is written: read them
	// until both have every answer, and then once more.
	var st status
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(5 * time.Second)
	for {
		st = consoleStatus(t, base+"/status.json")
		_, fams = scrape(t, base+"/metrics")
		if st.Summary.Calls >= answers && int64(sumOf(fams, "kernrpc_server_calls_total", labels{}))+unserved >= answers || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.Summary.Calls != answers {
		t.Errorf("the console counted %d calls, the client made %d attempts", st.Summary.Calls, answers)
	}

	// Per method and code.
	var consoleErrors, metricsCalls int64
	seen := map[string]bool{}
	for _, m := range st.Methods {
		consoleErrors += m.Errors
		if m.Method == notServed {
			if got := m.Codes["Unimplemented"]; got != unserved || m.Calls != unserved {
				t.Errorf("the console counts %d calls not served here (%v), want %d Unimplemented", m.Calls, m.Codes, unserved)
			}
			continue
		}
		i := strings.LastIndexByte(m.Method, '.')
		service, method := m.Method[:max(i, 0)], m.Method[i+1:]
		if m.Service != service {
			t.Errorf("the console's service of %s is %q, want %q", m.Method, m.Service, service)
		}
		for code, want := range m.Codes {
			seen[method+" "+code] = true
			got := sumOf(fams, "kernrpc_server_calls_total", labels{"service": service, "method": method, "code": code})
			if got != float64(want) {
				t.Errorf("%s with %s: the console counts %d calls, /metrics %g", m.Method, code, want, got)
			}
		}
		var errs int64
		for code, c := range m.Codes {
			if code != "OK" {
				errs += c
			}
		}
		if errs != m.Errors {
			t.Errorf("%s: the console counts %d errors but %d calls not OK", m.Method, m.Errors, errs)
		}
	}
	for _, s := range fams["kernrpc_server_calls_total"].GetMetric() {
		l := labelMap(s)
		metricsCalls += int64(s.GetCounter().GetValue())
		if !seen[l["method"]+" "+l["code"]] {
			t.Errorf("/metrics counts %g calls of %s.%s with %s, the console none", s.GetCounter().GetValue(), l["service"], l["method"], l["code"])
		}
		if l["method"] == "Nope" {
			t.Error("/metrics counts calls of Echo.Nope, which the server does not serve")
		}
	}
	if !seen["Fail ResourceExhausted"] || !seen["Fail FailedPrecondition"] || !seen["Say OK"] {
		t.Errorf("codes seen %v, want Say OK and Fail with FailedPrecondition and ResourceExhausted", seen)
	}
	if metricsCalls+unserved != st.Summary.Calls {
		t.Errorf("/metrics counts %d calls, the console %d of which %d not served here", metricsCalls, st.Summary.Calls, unserved)
	}
	if consoleErrors != st.Summary.Errors {
		t.Errorf("the console's summary counts %d errors, its methods %d", st.Summary.Errors, consoleErrors)
	}

	// In flight and connections.
	if got := sumOf(fams, "kernrpc_server_calls_in_flight", labels{}); got != 0 || st.Summary.InFlight != 0 {
		t.Errorf("in flight after the burst: /metrics %g, the console %d; want 0", got, st.Summary.InFlight)
	}
	for _, c := range st.Connections {
		if c.InFlight != 0 {
			t.Errorf("a connection of the console has %d calls in flight after the burst", c.InFlight)
		}
	}
	open := sumOf(fams, "kernrpc_server_connections_open", labels{})
	if open < 1 || open != float64(st.Summary.Connections) || open != float64(len(st.Connections)) {
		t.Errorf("connections open: /metrics %g, the console's summary %d and list %d; want them equal, at least 1", open, st.Summary.Connections, len(st.Connections))
	}

	// Every state reading the console shows is on /metrics with the same
	// value: a plugin's with the side of the server.
	readings := 0
	for _, sv := range st.State {
		for _, r := range sv.Readings {
			readings++
			want := labels(r.Labels)
			if sv.Kind != string(kernel.KindEngine) {
				want = labels{"side": "server"}
				for k, v := range r.Labels {
					want[k] = v
				}
			}
			name := "kernrpc_" + r.Name
			if _, ok := fams[name]; !ok {
				t.Errorf("the console shows %s %s's reading %s, /metrics has no %s", sv.Kind, sv.Name, r.Name, name)
				continue
			}
			got := sumOf(fams, name, want)
			// A token bucket refills between the two reads.
			if math.Abs(got-r.Value) > 1e-3*math.Max(1, math.Abs(r.Value)) {
				t.Errorf("%s%v: the console shows %g, /metrics %g", name, want, r.Value, got)
			}
		}
	}
	if readings == 0 {
		t.Error("the console shows no state reading")
	}
	if got := sumOf(fams, "kernrpc_token_bucket_rejected_total", labels{}); got != sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Fail", "code": "ResourceExhausted"}) {
		t.Errorf("the bucket rejected %g calls, /metrics counts %g answered ResourceExhausted", got, sumOf(fams, "kernrpc_server_calls_total", labels{"method": "Fail", "code": "ResourceExhausted"}))
	}
}

func consoleStatus(t *testing.T, url string) status {
	t.Helper()
	var st status
	if err := json.Unmarshal(get(t, url, "application/json"), &st); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	sort.Slice(st.Methods, func(i, j int) bool { return st.Methods[i].Method < st.Methods[j].Method })
	return st
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
