package consultest_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/plugins/registry/consul"
	"github.com/kernrpc/kernrpc/plugintest"
)

// options are the plugin's options against addr, with short timings for
// tests.
func options(addr string) map[string]any {
	return map[string]any{
		"address": addr, "ttl": "1s", "wait_time": "5s", "timeout": "2s",
		"session_ttl": "1s", "load_report_interval": "300ms", "deregister_critical_service_after": "1m",
	}
}

func TestConformance(t *testing.T) {
	s := standIn(t, fast)
	plugintest.Registry(t, consul.Factory, plugintest.RegistryConfig{
		Options:   options(s.Addr()),
		TTL:       500 * time.Millisecond,
		Tolerance: time.Second,
		// One value of 30 KiB beside the suite's other metadata fits the
		// 31744 bytes of JSON an instance's Meta holds.
		MaxMetadataValue: 30 * 1024,
	})
}

// TestConformanceAgainstARealAgent runs the same suite against a real
// Consul agent: the one $CONSUL_HTTP_ADDR names, or a dev agent started
// from the consul binary on PATH.
func TestConformanceAgainstARealAgent(t *testing.T) {
	addr := realAgent(t)
	plugintest.Registry(t, consul.Factory, plugintest.RegistryConfig{
		Options:          options(addr),
		TTL:              time.Second,
		Tolerance:        3 * time.Second,
		MaxMetadataValue: 30 * 1024,
	})
}

// realAgent returns the address of a real agent, or skips saying why
// there is none.
func realAgent(t *testing.T) string {
	t.Helper()
	if addr := os.Getenv("CONSUL_HTTP_ADDR"); addr != "" {
		return addr
	}
	bin, err := exec.LookPath("consul")
	if err != nil {
		t.Skip("no real Consul agent: CONSUL_HTTP_ADDR is not set and no consul binary is on PATH; " +
			"the plugin was checked against the in-process stand-in only (TestConformance)")
	}
	ports := freePorts(t, 4)
	cmd := exec.Command(bin, "agent", "-dev", "-bind=127.0.0.1", "-client=127.0.0.1",
		"-http-port="+ports[0], "-serf-lan-port="+ports[1], "-serf-wan-port="+ports[2], "-server-port="+ports[3],
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		`-hcl=session_ttl_min = "500ms"`)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s agent -dev: %v", bin, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := "127.0.0.1:" + ports[0]
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/v1/status/leader")
		if err == nil {
			var b [64]byte
			n, _ := resp.Body.Read(b[:])
			resp.Body.Close()
			if resp.StatusCode == 200 && n > 2 { // a leader's address, not ""
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dev agent at %s has no leader after 30s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePorts(t *testing.T, n int) []string {
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		out = append(out, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	return out
}

// ctx bounds a test's calls.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}
