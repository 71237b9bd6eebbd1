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
