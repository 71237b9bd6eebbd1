package kernrpc_test

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
)

// The methods view is grouped by service (the name up to its last dot),
// as the page draws it, one heading a service: a service whose name
// sorts between the methods of another (Svc.Sub between Svc.A and Svc.Z)
// must not split that one in two, nor may the calls of methods not served
// here (of no service) split the methods of no service.
func TestConsoleMethodsAreGroupedByService(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.AdminAddress = "127.0.0.1:0"
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		for _, m := range []string{"Svc.A", "Svc.Sub.X", "Svc.Z", "ping"} {
			kernrpc.Handle(s, m, echo)
		}
	})
	cli := newClient(t, cfg)
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "nosuch", &echopb.Echo{Text: "x"}, &resp); err == nil {
		t.Fatal("a call of a method not served here succeeded")
	}
	var methods []consoleMethod
	getJSON(t, "http://"+srv.AdminAddr()+"/status/methods.json", &methods)
	seen := map[string]bool{}
	var order []string
	for i, m := range methods {
		if i > 0 && methods[i-1].Service == m.Service {
			order = append(order, m.Method)
			continue
		}
		if seen[m.Service] {
			t.Errorf("service %q comes twice in the methods view, split by another: %v", m.Service, append(order, m.Method))
		}
		seen[m.Service] = true
		order = append(order, m.Method)
	}
}
