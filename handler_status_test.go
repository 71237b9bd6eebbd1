package kernrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// Statuses a handler returns, as its caller gets them.

// downstreamGone is what a kernrpc client inside a handler gets when the
// service it calls went away: Unavailable, and Retryable, since that call
// was never processed there.
var downstreamGone = &kernel.Status{Code: kernel.Unavailable, Message: "server 10.0.0.9:7000 went away without serving the call", Retryable: true}

// A handler that returns a downstream call's error as it got it must not
// promise its own caller that this call was not processed: the handler
// ran. Relayed with the flag, the caller's client resent the call, running
// the handler again (a retry filter does so even for a non_idempotent
// method), and took the instance for one shutting down.
func TestAHandlersRetryableStatusReachesTheCallerAsProcessed(t *testing.T) {
	cfg := testConfig(t)
	var unary, stream atomic.Int32
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Relay.Call", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			unary.Add(1)
			return nil, downstreamGone
		})
		kernrpc.HandleServerStream(s, "Relay.Stream", func(ctx context.Context, _ *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			stream.Add(1)
			return downstreamGone
		})
	})
	cli := newClient(t, cfg)
	ctx := context.Background()

	err := cli.Call(ctx, "Relay.Call", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Unavailable || kernel.IsRetryable(err) {
		t.Errorf("Call: %v (retryable %v); want the handler's Unavailable, not retryable", err, kernel.IsRetryable(err))
	}
	if n := unary.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one call", n)
	}

	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Relay.Stream", &echopb.Echo{})
	if err == nil {
		_, err = st.Recv()
	}
	if kernel.CodeOf(err) != kernel.Unavailable || kernel.IsRetryable(err) {
		t.Errorf("stream: %v (retryable %v); want the handler's Unavailable, not retryable", err, kernel.IsRetryable(err))
	}
	if n := stream.Load(); n != 1 {
		t.Errorf("the stream's handler ran %d times for one stream", n)
	}
}

// A handler's status whose code is above what a frame may carry (2^31; a
// service's own numbering, say) reaches its caller as Unknown with its
// message: sent as it was, the client's transport took the answer for a
// malformed frame and closed the connection, failing every call on it.
func TestAHandlersOutOfRangeCodeFailsOnlyItsCall(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Odd.Code", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, &kernel.Status{Code: kernel.Code(1<<32 - 1), Message: "custom"}
		})
	})
	cli := newClient(t, cfg)
	err := cli.Call(context.Background(), "Odd.Code", &echopb.Echo{}, &echopb.Echo{})
	if st := kernel.StatusOf(err); st.Code != kernel.Unknown || st.Message != "custom" {
		t.Errorf("Call: %v; want Unknown saying custom", err)
	}
}

// A handler that returns a nil *kernel.Status as its error (a typed nil: a
// non-nil error) fails its call with Unknown. It took the server's process
// down: the answer path read the code of the nil status StatusOf gave.
func TestAHandlersNilStatusErrorFailsItsCallAsUnknown(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Nil.Status", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			var st *kernel.Status
			return nil, st
		})
	})
	cli := newClient(t, cfg)
	err := cli.Call(context.Background(), "Nil.Status", &echopb.Echo{}, &echopb.Echo{})
	if kernel.CodeOf(err) != kernel.Unknown {
		t.Errorf("Call: %v; want Unknown", err)
	}
}

// A typed unary handler that returns a nil response and no error answers
// the empty message, as grpc-go does (protobuf reads a nil message as an
// empty one): a server ported from grpc-go that answers so keeps working.
func TestATypedHandlerAnsweringANilResponseSendsTheEmptyMessage(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Nil.Answer", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			return nil, nil
		})
	})
	cli := newClient(t, cfg)
	reply := &echopb.Echo{Text: "stale"}
	if err := cli.Call(context.Background(), "Nil.Answer", &echopb.Echo{}, reply); err != nil || reply.Text != "" {
		t.Errorf("Call: %v, reply %q; want OK and the empty message", err, reply.Text)
	}
}
