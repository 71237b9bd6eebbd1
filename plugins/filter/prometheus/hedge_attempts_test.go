package prometheus_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/filter/hedge"
	"github.com/kernrpc/kernrpc/plugins/filter/prometheus"
	_ "github.com/kernrpc/kernrpc/plugins/filter/retry"
)

// A hedged call whose first attempt wins after the hedge was sent took
// two attempts: kernrpc_client_attempts_total must say 2, as its help
// says ("retries and hedges included").
func TestAttemptsCountHedgeThatLost(t *testing.T) {
	const yaml = `
service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: "prometheus/NS"}}
client: {timeout: 5s}
filters:
  - {name: prometheus, options: {go_metrics: false, process_metrics: false}}
  - {name: hedge, side: client, options: {max_attempts: 2, delay: 10ms}}
`
	// The first attempt answers once the hedge has reached the server, so
	// that it wins after the hedge was sent however late the hedge's
	// timer fires; the hedge waits to be cancelled.
	var n atomic.Int32
	hedged := make(chan struct{})
	_, cli, _, cf := echoService(t, yaml, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Slow", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			if n.Add(1) > 1 {
				close(hedged)
				<-ctx.Done()
				return nil, ctx.Err()
			}
			select {
			case <-hedged:
				return req, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
	})

	callCountingAttempts(t, cli, cf, &n, 2)
}

// A hedged call whose losing attempt was retried (a retry filter after
// the hedge runs in each of its attempts) took every attempt that reached
// a server, the loser's retry included.
func TestAttemptsCountALosersRetry(t *testing.T) {
	const yaml = `
service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: "prometheus/NS"}}
client: {timeout: 5s}
filters:
  - {name: prometheus, options: {go_metrics: false, process_metrics: false}}
  - {name: hedge, side: client, options: {max_attempts: 2, delay: 10ms}}
  - {name: retry, side: client, options: {backoff: 1ms, max_backoff: 1ms}}
`
	// The first request to arrive answers once the third has; the second
	// fails, and its attempt's retry filter sends it again: the third,
	// which waits to be cancelled.
	var n atomic.Int32
	third := make(chan struct{})
	_, cli, _, cf := echoService(t, yaml, func(srv *kernrpc.Server) {
		kernrpc.Handle(srv, "Echo.Slow", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			switch n.Add(1) {
			case 1:
				select {
				case <-third:
					return req, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			case 2:
				return nil, kernel.Errorf(kernel.Unavailable, "try another")
			default:
				close(third)
				<-ctx.Done()
				return nil, ctx.Err()
			}
		})
	})

	callCountingAttempts(t, cli, cf, &n, 3)
}

// callCountingAttempts makes the test's one call of Echo.Slow, whose
// handler counts its attempts in n, and wants the server to have seen
// want of them and cf's kernrpc_client_attempts_total to say as many.
func callCountingAttempts(t *testing.T, cli *kernrpc.Client, cf *prometheus.Filter, n *atomic.Int32, want int32) {
	t.Helper()
	var resp wrapperspb.StringValue
	if err := cli.Call(context.Background(), "Echo.Slow", wrapperspb.String("x"), &resp); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != want {
		t.Fatalf("the server saw %d attempts; want %d", got, want)
	}
	mfs, err := cf.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kernrpc_client_attempts_total" {
			continue
		}
		if ms := mf.GetMetric(); len(ms) != 1 || ms[0].GetCounter().GetValue() != float64(want) {
			t.Errorf("kernrpc_client_attempts_total = %v for the one call that took %d attempts", ms, want)
		}
		return
	}
	t.Fatal("no kernrpc_client_attempts_total")
}
