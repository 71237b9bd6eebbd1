package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A stream's final status that the transport refuses alone (its trailers
// over max_metadata_bytes) is answered with the reason, as a unary answer
// refused so is: the client gets ResourceExhausted at once, not a stream
// that ends only with its context.
func TestAStreamsRefusedFinalStatusIsAnsweredWithTheReason(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		startServer(t, cfg, func(srv *kernrpc.Server) {
			kernrpc.HandleServerStream(srv, "Big.Trailer", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
				if err := st.Send(&echopb.Echo{Text: "one"}); err != nil {
					return err
				}
				st.SetTrailer(kernel.Metadata{"big": strings.Repeat("t", 100<<10)})
				return nil
			})
		})
		cli := newClient(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Big.Trailer", &echopb.Echo{})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); err != nil || m.Text != "one" {
			t.Fatalf("first Recv = %v, %v; want the handler's message", m, err)
		}
		_, err = st.Recv()
		switch {
		case errors.Is(err, io.EOF) || err == nil:
			t.Fatalf("second Recv = %v; the trailers could not be sent, so the stream cannot end OK with them", err)
		case ctx.Err() != nil:
			t.Fatalf("second Recv = %v, once the stream's context ended: the refused final status left the client waiting", err)
		case kernel.CodeOf(err) != kernel.ResourceExhausted || !strings.Contains(err.Error(), "could not send the answer"):
			t.Fatalf("second Recv = %v; want ResourceExhausted saying the server could not send its answer", err)
		}
	})
}

// The response headers go on the server's first StreamData that goes
// out: a first message the transport refuses alone (over max_frame_size)
// does not take them with it, so the client still gets them, with the
// next message or, if none follows, with the final status.
func TestStreamHeadersSurviveAFirstMessageTheTransportRefuses(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Options["max_frame_size"] = "64KiB"
	startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.HandleServerStream(srv, "Big.First", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			st.SetHeader(kernel.Metadata{"h": "v"})
			if err := st.Send(&echopb.Echo{Payload: make([]byte, 100<<10)}); kernel.CodeOf(err) != kernel.ResourceExhausted {
				return kernel.Errorf(kernel.Internal, "oversized Send = %v; want ResourceExhausted", err)
			}
			if req.Text == "then-small" {
				return st.Send(&echopb.Echo{Text: "small"})
			}
			return nil
		})
	})
	cli := newClient(t, cfg)
	for _, then := range []string{"then-small", "then-return"} {
		t.Run(then, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Big.First", &echopb.Echo{Text: then})
			if err != nil {
				t.Fatal(err)
			}
			if md, err := st.Header(); err != nil || md["h"] != "v" {
				t.Fatalf("Header() = %v, %v; want the handler's header h=v", md, err)
			}
			for {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("Recv = %v", err)
				}
				if m.Text != "small" {
					t.Fatalf("Recv = %v; want only the small message", m)
				}
			}
		})
	}
}

// Headers the transport refuses whatever message they go with (over
// max_metadata_bytes) are not dropped for the messages after them to go
// without: the stream ends ResourceExhausted, as for trailers so refused.
func TestStreamHeadersTheTransportRefusesFailTheStream(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.HandleServerStream(srv, "Big.Header", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			st.SetHeader(kernel.Metadata{"big": strings.Repeat("h", 100<<10)})
			for range 2 {
				if err := st.Send(&echopb.Echo{Text: "one"}); kernel.CodeOf(err) != kernel.ResourceExhausted {
					return kernel.Errorf(kernel.Internal, "Send with the headers = %v; want ResourceExhausted", err)
				}
			}
			return nil
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Big.Header", &echopb.Echo{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	switch {
	case err == nil:
		t.Fatalf("Recv = %v; a message went out without the headers the handler set", m)
	case ctx.Err() != nil:
		t.Fatalf("Recv = %v, once the stream's context ended", err)
	case kernel.CodeOf(err) != kernel.ResourceExhausted:
		t.Fatalf("Recv = %v; want ResourceExhausted: the headers could not be sent", err)
	}
}
