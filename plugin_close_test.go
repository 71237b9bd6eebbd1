package kernrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// closeFails is a pass-through filter whose Close fails.
type closeFails struct{}

func (closeFails) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (closeFails) Close() error { return errors.New("flush to disk failed") }

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-close-fails", New: func(any) (kernel.Filter, error) { return closeFails{}, nil }})
}

// A plugin that fails to close is logged at WARN, by kind and name, when
// its server shuts down or its client closes; the shutdown or close goes
// on.
func TestPluginThatFailsToCloseIsLogged(t *testing.T) {
	logs := enginetest.DefaultLog(t)

	cfg := testConfig(t)
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-close-fails"}}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); err != nil {
		t.Errorf("Client.Close: %v; a plugin's failure is logged, not returned", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v; a plugin's failure is logged, not returned", err)
	}
	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "closing plugin") {
			warned = append(warned, line)
		}
	}
	want := `kind=filter plugin=test-close-fails err="flush to disk failed"`
	if len(warned) != 2 ||
		!strings.Contains(warned[0], `level=WARN msg="closing plugin" component=kernrpc.client`) || !strings.Contains(warned[0], want) ||
		!strings.Contains(warned[1], `level=WARN msg="closing plugin" component=kernrpc.server`) || !strings.Contains(warned[1], want) {
		t.Errorf("logged on closing:\n%s\nwant a WARN line from the client, then one from the server, each with %s", strings.Join(warned, "\n"), want)
	}
}
