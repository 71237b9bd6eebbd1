package kernrpc_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// endOrder is a stream filter that counts the streams whose InvokeStream
// has not returned, and at Close records how many there were: a filter's
// last act on a stream (a span's end, say) may need what Close shuts.
type endOrder struct {
	mu      sync.Mutex
	running int
	atClose chan int
}

func (e *endOrder) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (e *endOrder) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	e.mu.Lock()
	e.running++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running--
		e.mu.Unlock()
	}()
	return next(ctx, info, st)
}

func (e *endOrder) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.atClose <- e.running
	return nil
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-end-order", New: func(any) (kernel.Filter, error) {
		return &endOrder{atClose: make(chan int, 1)}, nil
	}})
}

// Client.Close ends every stream and lets its client filters return
// before it closes them: a stream read to its end just before Close, and
// one left open, unread.
func TestClientCloseLetsStreamFiltersEndFirst(t *testing.T) {
	for _, readToEnd := range []bool{true, false} {
		cfg := testConfig(t)
		startServer(t, cfg, streamHandlers)
		ccfg := *cfg
		ccfg.Filters = []kernrpc.FilterConfig{{Name: "test-end-order", Side: "client"}}
		cli, err := kernrpc.NewClient(&ccfg, "echo")
		if err != nil {
			t.Fatal(err)
		}
		eo, _ := kernrpc.FindPlugin[*endOrder](cli.Plugins(), "test-end-order")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3"})
		if err != nil {
			t.Fatal(err)
		}
		if readToEnd {
			for {
				if _, err := st.Recv(); err == io.EOF {
					break
				} else if err != nil {
					t.Fatal(err)
				}
			}
		}
		closed := make(chan error, 1)
		go func() { closed <- cli.Close() }()
		receive(t, closed, 10*time.Second, "Client.Close did not return")
		if n := receive(t, eo.atClose, time.Second, "the filter was not closed"); n != 0 {
			t.Errorf("read to its end %v: %d stream filters still ran when Close closed the filter", readToEnd, n)
		}
		cancel()
	}
}
