package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

// On shm-ring a frame that finds no room in a full ring for wait_timeout
// is refused alone (ResourceExhausted) and the connection carries on. A
// WindowUpdate refused so carries credit the peer is owed and will never
// get: nothing sends it again. Here the server's grant of the connection
// credit a stream left unread is refused while its client, with no call
// or stream open, reads nothing (its ring is full of the late messages of
// a stream it cancelled). Once the client reads again, the next stream on
// the connection finds the connection's window spent for good: it must
// end (the connection closed, the stream failed or opened again), never
// wait for credit that will not come.
func TestStreamGrantRefusedByAFullRingDoesNotStallTheConnection(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Transport.Name = "shm-ring"
	cfg.Transport.Options = map[string]any{"ring_size": "16KiB", "wait_timeout": "10ms"}
	srvCfg := *cfg
	srvCfg.Streams.Window, srvCfg.Streams.ConnectionWindow = 8<<10, 8<<10
	release := make(chan struct{})
	flooded := make(chan struct{})
	startServer(t, &srvCfg, func(srv *kernrpc.Server) {
		// Hold.In reads nothing; once cancelled it returns when released,
		// and the server grants back the connection credit of what it
		// left unread.
		kernrpc.HandleClientStream(srv, "Hold.In", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
			<-ctx.Done()
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			return nil, ctx.Err()
		})
		// Flood.Late, once its client cancelled it (and so reads nothing
		// more), sends until the ring has no room for even an empty
		// message: ResourceExhausted after wait_timeout. Its own final
		// status would find no room either, and close the connection
		// (answerRefused): it returns only once the grant was refused.
		kernrpc.HandleServerStream(srv, "Flood.Late", func(ctx context.Context, _ *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			<-ctx.Done()
			time.Sleep(5 * time.Millisecond) // the client's reader has left
			for _, size := range []int{1 << 10, 0} {
				m := &echopb.Echo{Payload: make([]byte, size)}
				for st.Send(m) == nil {
				}
			}
			close(flooded)
			<-release
			for end := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "flow-control credit not sent") && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			return nil
		})
		// Sink.Count reads everything and answers how many.
		kernrpc.HandleClientStream(srv, "Sink.Count", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
			n := 0
			for {
				if _, err := st.Recv(); errors.Is(err, io.EOF) {
					return &echopb.Echo{Text: strconv.Itoa(n)}, nil
				} else if err != nil {
					return nil, err
				}
				n++
			}
		})
	})
	cli := newClient(t, cfg) // the client's own windows are the defaults
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// 6 KiB of the server's 8 KiB connection window, left unread.
	hold, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Hold.In")
	if err != nil {
		t.Fatal(err)
	}
	msg := &echopb.Echo{Payload: make([]byte, 1000)}
	for i := range 6 {
		if err := hold.Send(msg); err != nil {
			t.Fatalf("send %d on Hold.In: %v", i, err)
		}
	}
	flood, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Late", &echopb.Echo{})
	if err != nil {
		t.Fatal(err)
	}
	// Both cancelled: no stream is left, and nobody reads the connection.
	hold.Close()
	flood.Close()
	receive(t, flooded, 10*time.Second, "Flood.Late never filled the ring")
	close(release)
	// Hold.In's end grants its 6 KiB back; the ring has no room for it.
	time.Sleep(50 * time.Millisecond)

	// The client reads again (a stream is open). Sink.Count reads all it
	// gets, so its 8 messages go through unless credit was lost.
	done := make(chan error, 1)
	go func() {
		sink, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Sink.Count")
		if err != nil {
			done <- err
			return
		}
		defer sink.Close()
		for range 8 {
			if err := sink.Send(msg); err != nil {
				done <- err
				return
			}
		}
		if err := sink.CloseSend(); err != nil {
			done <- err
			return
		}
		m, err := sink.Recv()
		if err == nil && m.Text != "8" {
			err = errors.New("Sink.Count read " + m.Text + " messages, want 8")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil && kernel.CodeOf(err) != kernel.Unavailable {
			t.Fatalf("the stream after a refused grant: %v; want it served, or Unavailable (its connection closed)", err)
		}
		// It was refused indeed, or this test checked nothing.
		if log := logs.String(); !strings.Contains(log, "flow-control credit not sent") || !strings.Contains(log, "call_id=0") {
			t.Fatalf("the server logged no refused connection grant; the scenario did not take place:\n%s", log)
		}
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("a stream on a connection whose server's grant the ring refused never ended: it waits for credit that will not come, though both sides read")
	}
}
