package kernrpc_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// Tests of where a configured filter applies: its side and its methods.

// sidedFilter passes calls on and works on one side only.
type sidedFilter struct {
	side   kernel.Side
	closed *atomic.Int32
}

func (sidedFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f sidedFilter) Side() kernel.Side { return f.side }

func (f sidedFilter) Close() error {
	f.closed.Add(1)
	return nil
}

type sidedOptions struct {
	Note string `json:"note"`
}

// How often the client-only filter was closed; othersClosed counts the rest.
var clientOnlyClosed, othersClosed atomic.Int32

func init() {
	for name, side := range map[string]kernel.Side{"test-client-only": kernel.ClientSide, "test-server-only": kernel.ServerSide, "test-no-side": 7} {
		closed := &clientOnlyClosed
		if side != kernel.ClientSide {
			closed = &othersClosed
		}
		kernel.RegisterFilter(kernel.NewFactory(name, "passes calls on, on one side only",
			func() *sidedOptions { return &sidedOptions{} },
			func(*sidedOptions) (kernel.Filter, error) { return sidedFilter{side, closed}, nil }))
	}
}

func builtNames(built []kernrpc.BuiltPlugin) string {
	var names []string
	for _, b := range built {
		if b.Kind == kernel.KindFilter {
			names = append(names, b.Name)
		}
	}
	return strings.Join(names, ",")
}

// An entry with no side puts a one-sided filter on its side only: the
// other side neither runs it nor keeps it open.
func TestOneSidedFilterWithNoSideIsLeftOutOfTheOtherSide(t *testing.T) {
	cfg := withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-client-only"}, kernrpc.FilterConfig{Name: "test-server-only"})
	closedBefore := clientOnlyClosed.Load()
	srv := startServer(t, cfg, nil)
	if got := builtNames(srv.Plugins()); got != "test-server-only" {
		t.Errorf("server's filters: %q; want test-server-only alone", got)
	}
	if n := clientOnlyClosed.Load() - closedBefore; n != 1 {
		t.Errorf("the client-only filter the server built to learn its side was closed %d times; want 1", n)
	}
	cli := newClient(t, cfg)
	if got := builtNames(cli.Plugins()); got != "test-client-only" {
		t.Errorf("client's filters: %q; want test-client-only alone", got)
	}
	var resp echopb.Echo
	if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &resp); err != nil || resp.Text != "x" {
		t.Fatalf("call through both sides' filters: %v (%q)", err, resp.Text)
	}
}

// An entry that names the side a one-sided filter does not work on is a
// config error on that side, saying which side to name.
func TestOneSidedFilterNamedOnTheOtherSideIsAConfigError(t *testing.T) {
	cfg := testConfig(t)
	cfg.Source = "echo.yaml"
	cfg = withFilters(cfg, kernrpc.FilterConfig{Name: "test-pass"}, kernrpc.FilterConfig{Name: "test-client-only", Side: "server"})
	closedBefore := clientOnlyClosed.Load()
	_, err := kernrpc.NewServer(cfg)
	for _, want := range []string{"echo.yaml", "filters[1].side", `is server, but filter "test-client-only" works on the client side only`, "set side: client, or leave side out"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("NewServer: %v; want an error saying %q", err, want)
		}
	}
	if n := clientOnlyClosed.Load() - closedBefore; n != 1 {
		t.Errorf("the misplaced filter was closed %d times; want 1", n)
	}
	// The client builds no server entry, so it has nothing to refuse.
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	_ = cli.Close()

	cfg = withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-server-only", Side: "client"})
	if _, err := kernrpc.NewClient(cfg, "echo"); err == nil || !strings.Contains(err.Error(), `filter "test-server-only" works on the server side only; set side: server`) {
		t.Fatalf("NewClient: %v; want the server-only filter refused", err)
	}
}

// A filter declaring a side that is neither is refused on both, not left
// out of both in silence.
func TestFilterDeclaringNeitherSideIsRefused(t *testing.T) {
	cfg := withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-no-side"})
	if _, err := kernrpc.NewServer(cfg); err == nil || !strings.Contains(err.Error(), "filters[0] (test-no-side) declares side Side(7), which is neither client nor server") {
		t.Errorf("NewServer: %v; want the filter's side refused", err)
	}
	if _, err := kernrpc.NewClient(cfg, "echo"); err == nil || !strings.Contains(err.Error(), "neither client nor server") {
		t.Errorf("NewClient: %v; want the filter's side refused", err)
	}
}

// A server says at Start which of its filters' method patterns match none
// of its methods (a misspelt name leaves a filter applied to nothing), and
// says nothing of those that match.
func TestServerWarnsOfMethodPatternsMatchingNothing(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := withFilters(testConfig(t), kernrpc.FilterConfig{Name: "test-pass", Side: "server", Methods: []string{"Echo.Ech", "Echo.*", "Echo.Echo"}},
		kernrpc.FilterConfig{Name: "test-pass", Side: "server", Methods: []string{"Billing.*"}})
	startServer(t, cfg, nil)
	out := logs.String()
	for _, want := range []string{`filter=test-pass pattern=Echo.Ech`, `filter=test-pass pattern=Billing.*`, "check its spelling", "Echo.Echo"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "matches none of the methods"); n != 2 {
		t.Errorf("%d warnings; want 2, for Echo.Ech and Billing.*, none for the patterns that match:\n%s", n, out)
	}
}
