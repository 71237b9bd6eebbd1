package kernrpc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// The server ends a stream at the deadline its client sent, whether or
// not the client ends it too: a client of another make may not. The
// handler's wait and the client both get DeadlineExceeded, saying whose
// deadline it was. The client here is raw frames, which never cancel.
func TestServerEndsAStreamAtTheDeadlineItWasSent(t *testing.T) {
	cfg := testConfig(t)
	waited := make(chan error, 1)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.HandleBidiStream(s, "Wait.Recv", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			_, err := st.Recv()
			waited <- err
			return err
		})
	})
	conn := dialRaw(t, srv.Addr())
	for _, f := range []*kernel.Frame{
		{Type: kernel.FrameWindowUpdate, Credit: 1 << 20},
		{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: 1, Method: "Wait.Recv", Codec: "protobuf",
			Timeout: 50 * time.Millisecond, Credit: 1 << 20},
	} {
		if err := conn.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	const want = "the deadline the client sent for the stream of Wait.Recv passed"
	err := receive(t, waited, 5*time.Second, "the handler's Recv did not end at the stream's deadline")
	if kernel.CodeOf(err) != kernel.DeadlineExceeded || !strings.Contains(err.Error(), want) {
		t.Errorf("the handler's Recv: %v; want DeadlineExceeded saying %q", err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		f, err := conn.ReadFrame(ctx)
		if err != nil {
			t.Fatalf("no end of the stream reached the client: %v", err)
		}
		if f.Type != kernel.FrameResponse || f.CallID != 1 {
			f.Release()
			continue
		}
		if f.Code != kernel.DeadlineExceeded || !strings.Contains(f.Message, want) {
			t.Errorf("the stream ended with %v %q; want DeadlineExceeded saying %q", f.Code, f.Message, want)
		}
		f.Release()
		return
	}
}
