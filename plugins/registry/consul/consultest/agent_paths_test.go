package consultest_test

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
)

// An entry of the service that no client could dial (here a service
// registered by hand with no port) is left out of what Resolve gives, and
// logged at WARN once, not at every answer of the agent.
func TestEntriesNoClientCanDialAreLeftOut(t *testing.T) {
	logs := enginetest.DefaultLog(t) // before open: the registry keeps slog.Default's logger
	s := standIn(t, fast)
	agent := apiClient(t, s.Addr())
	for _, reg := range []*api.AgentServiceRegistration{
		{ID: "web-ok", Name: "web", Address: "127.0.0.1", Port: 9000},
		{ID: "web-noport", Name: "web", Address: "127.0.0.1"},
	} {
		if err := agent.Agent().ServiceRegister(reg); err != nil {
			t.Fatal(err)
		}
	}
	r := open(t, s.Addr(), nil)
	eventually(t, 5*time.Second, "the dialable entry resolved", resolveIs(t, r, "web", "web-ok"))
	// Another answer of the agent, with the same entry left out again.
	if err := agent.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-ok-2", Name: "web", Address: "127.0.0.1", Port: 9001}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the second dialable entry resolved", resolveIs(t, r, "web", "web-ok,web-ok-2"))
	const warn = `level=WARN msg="consul: leaving out an entry no client could dial"`
	if n := strings.Count(logs.String(), warn); n != 1 {
		t.Errorf("%d WARN lines for the entry left out over two answers, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "consul_id=web-noport") || !strings.Contains(logs.String(), "port 0, outside 1-65535") {
		t.Errorf("the WARN line does not name the entry and why:\n%s", logs.String())
	}
}

// unixProxy serves a Unix socket in a fresh directory, passing every
// connection on to the TCP address target, until t ends.
func unixProxy(t *testing.T, target string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "consul.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			open = append(open, c, up)
			mu.Unlock()
			wg.Go(func() { io.Copy(up, c); up.Close() })
			wg.Go(func() { io.Copy(c, up); c.Close() })
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return path
}

// An agent reached through its Unix socket (address unix:///path) serves
// as one reached over TCP.
func TestAgentOverAUnixSocket(t *testing.T) {
	s := standIn(t, fast)
	path := unixProxy(t, s.Addr())
	r := open(t, s.Addr(), map[string]any{"address": "unix://" + path})
	if err := r.Register(ctx(t), instance("echo", "a"), 0); err != nil {
		t.Fatalf("Register through unix://%s: %v", path, err)
	}
	eventually(t, 5*time.Second, "the instance resolved through the socket", resolveIs(t, r, "echo", "a"))
	if n := s.Requests("PUT /v1/agent/service/register"); n == 0 {
		t.Error("the registration never reached the agent behind the socket")
	}
	if _, err := consul.Factory.Build(map[string]any{"address": "unix://"}, "test.yaml"); err == nil || !strings.Contains(err.Error(), `option "address": "unix://" names no socket path`) {
		t.Errorf("address unix:// with no path: %v", err)
	}
}

// Register and ReportLoad refuse what the agent is never asked about.
func TestRegisterAndReportLoadRefusals(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), nil)
	for _, tc := range []struct {
		in   kernel.Instance
		ttl  time.Duration
		want string
	}{
		{kernel.Instance{ID: "a", Address: "127.0.0.1:1"}, 0, "instance has an empty Service"},
		{kernel.Instance{Service: "echo", Address: "127.0.0.1:1"}, 0, "register echo: instance has an empty ID"},
		{kernel.Instance{Service: "echo", ID: "a"}, 0, "register echo/a: instance has an empty Address"},
		{instance("echo", "a"), -time.Second, "register echo/a: negative ttl -1s"},
	} {
		if err := r.Register(ctx(t), tc.in, tc.ttl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Register(%+v, %s): %v; want %q", tc.in, tc.ttl, err, tc.want)
		}
	}
	if n := s.Requests("PUT /v1/agent/service/register"); n != 0 {
		t.Errorf("%d refused registrations reached the agent", n)
	}
	if err := r.ReportLoad(ctx(t), instance("echo", "b"), kernel.Load{InFlight: 1}); err == nil || !strings.Contains(err.Error(), "not registered through this registry") {
		t.Errorf("ReportLoad of an instance never registered: %v", err)
	}
	r.Close()
	if err := r.ReportLoad(ctx(t), instance("echo", "b"), kernel.Load{}); !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("ReportLoad after Close: %v; want ErrClosed", err)
	}
	if err := r.Deregister(ctx(t), instance("echo", "b")); !errors.Is(err, kernel.ErrClosed) {
		t.Errorf("Deregister after Close: %v; want ErrClosed", err)
	}
}

// An agent gone for a moment costs a registered instance nothing once it
// is back: the keeper's failed check passes and load write are logged at
// WARN and tried again, and the instance resolves with the latest load.
func TestKeeperRidesOutAnAgentBlip(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	s := standIn(t, fast)
	r := open(t, s.Addr(), map[string]any{"load_report_interval": "100ms"})
	observer := open(t, s.Addr(), nil)
	if err := r.Register(ctx(t), instance("echo", "a"), time.Second); err != nil {
		t.Fatal(err)
	}
	// The first report is written at once; the second waits for the end
	// of the interval, which falls while the agent is away.
	for _, inFlight := range []int64{1, 2} {
		if err := r.ReportLoad(ctx(t), instance("echo", "a"), kernel.Load{InFlight: inFlight}); err != nil {
			t.Fatal(err)
		}
	}
	s.Stop()
	eventually(t, 5*time.Second, "a failed check pass logged", func() bool {
		return strings.Contains(logs.String(), `msg="consul: passing a TTL check failed; trying again"`)
	})
	if !strings.Contains(logs.String(), `msg="consul: writing a load report failed; trying again at the end of the next interval"`) {
		t.Errorf("the load write that failed while the agent was away was not logged:\n%s", logs.String())
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.ReportLoad(ctx(t), instance("echo", "a"), kernel.Load{InFlight: 3}); err != nil {
		t.Fatalf("ReportLoad once the agent is back: %v", err)
	}
	eventually(t, 5*time.Second, "the instance resolved, passing, with the latest load", func() bool {
		set, err := observer.Resolve(ctx(t), "echo")
		return err == nil && len(set) == 1 && set[0].Load.InFlight == 3
	})
}
