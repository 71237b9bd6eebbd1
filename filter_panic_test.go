package kernrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// panicky is a server filter whose Admit or CallEnded panics when the
// call's metadata asks it to.
type panicky struct{}

func (panicky) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (panicky) Admit(_ context.Context, info *kernel.CallInfo) error {
	if info.Metadata["panic"] == "admit" {
		panic("admit bug")
	}
	return nil
}

func (panicky) CallEnded(info *kernel.CallInfo, _ error, _ bool) {
	if info.Metadata["panic"] == "ended" {
		panic("observer bug")
	}
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-panicky", New: func(any) (kernel.Filter, error) { return panicky{}, nil }})
}

// A filter's Admit or CallEnded that panics is a bug of that filter, not
// a crash of the server: a panic in Admit fails the call with Internal, one
// in CallEnded (after the answer) costs nothing but the log line, and both
// are logged at ERROR with the stack.
func TestFilterHooksThatPanicAreContained(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	startServer(t, withFilters(cfg, kernrpc.FilterConfig{Name: "test-panicky", Side: "server"}), nil)
	cli := newClient(t, cfg)
	call := func(mode string) (*echopb.Echo, error) {
		var out echopb.Echo
		ctx := kernrpc.WithMetadata(context.Background(), kernel.Metadata{"panic": mode})
		return &out, cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: mode}, &out)
	}
	if _, err := call("admit"); kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "a filter admitting Echo.Echo panicked: admit bug") {
		t.Errorf("a call whose Admit panicked: %v; want Internal naming the panic", err)
	}
	if out, err := call("ended"); err != nil || out.Text != "ended" {
		t.Errorf("a call whose CallEnded panicked: %v, %q; want its answer", err, out.Text)
	}
	if out, err := call("none"); err != nil || out.Text != "none" {
		t.Errorf("a call after both panics: %v, %q; want the server still serving", err, out.Text)
	}
	// CallEnded runs once the answer is sent: its line may come after it.
	eventually(5*time.Second, func() bool { return strings.Contains(logs.String(), "CallEnded panicked") })
	for _, want := range []string{`level=ERROR msg="filter's Admit panicked"`, `level=ERROR msg="filter's CallEnded panicked"`, "filter_panic_test.go"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
}
