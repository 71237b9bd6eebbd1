package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/echostream"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/transport/faulty"
	_ "github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

var streamTransports = []string{"tcp-lv", "shm-ring"}

// forEachTransport runs test once per transport streams must work on.
func forEachTransport(t *testing.T, test func(t *testing.T, cfg *kernrpc.Config)) {
	for _, tr := range streamTransports {
		t.Run(tr, func(t *testing.T) {
			cfg := testConfig(t)
			if tr != "tcp-lv" {
				cfg.Transport.Name, cfg.Transport.Options = tr, nil
			}
			test(t, cfg)
		})
	}
}

// streamHandlers registers the streaming methods the tests call.
func streamHandlers(srv *kernrpc.Server) {
	// Count.Up sends back n messages numbered 0..n-1, n from the request.
	kernrpc.HandleServerStream(srv, "Count.Up", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		n, err := strconv.Atoi(req.Text)
		if err != nil {
			return kernel.Errorf(kernel.InvalidArgument, "text %q is not a count", req.Text)
		}
		st.SetHeader(kernel.Metadata{"count": req.Text})
		for i := range n {
			if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i), Payload: req.Payload}); err != nil {
				return err
			}
		}
		st.SetTrailer(kernel.Metadata{"sent": strconv.Itoa(n)})
		return nil
	})
	// Count.Sum answers, once the client closes, the texts joined in order.
	kernrpc.HandleClientStream(srv, "Count.Join", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
		var all string
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return &echopb.Echo{Text: all}, nil
			}
			if err != nil {
				return nil, err
			}
			all += m.Text + ","
		}
	})
	// Count.Echo answers every message with itself until the client closes.
	kernrpc.HandleBidiStream(srv, "Count.Echo", echostream.Serve[echopb.Echo])
	// Count.Wait blocks until its context ends, then returns its error.
	kernrpc.HandleBidiStream(srv, "Count.Wait", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
		if err := st.Send(&echopb.Echo{Text: "waiting"}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	})
}

func TestStreamKinds(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		startServer(t, cfg, streamHandlers)
		cli := newClient(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		t.Run("server", func(t *testing.T) {
			st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "2000"})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					if i != 2000 {
						t.Fatalf("stream ended after %d messages, want 2000", i)
					}
					break
				}
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if m.Text != strconv.Itoa(i) {
					t.Fatalf("message %d is %q: out of order", i, m.Text)
				}
			}
			if h, err := st.Header(); err != nil || h["count"] != "2000" {
				t.Errorf("header = %v, %v; want count=2000", h, err)
			}
			if tr := st.Trailer(); tr["sent"] != "2000" {
				t.Errorf("trailer = %v; want sent=2000", tr)
			}
		})
		// Read late, the messages wait queued: past the few the transport
		// lends, each is copied into the stream's slabs, several of them.
		t.Run("server, read late", func(t *testing.T) {
			st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "3000", Payload: []byte("0123456789")})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			for i := range 3000 {
				m, err := st.Recv()
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if m.Text != strconv.Itoa(i) || string(m.Payload) != "0123456789" {
					t.Fatalf("message %d is %q, payload %q: a queued copy was overwritten", i, m.Text, m.Payload)
				}
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after 3000 messages: %v, want io.EOF", err)
			}
		})
		t.Run("client", func(t *testing.T) {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Join")
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			for i := range 500 {
				if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i)}); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				want += strconv.Itoa(i) + ","
			}
			resp, err := st.CloseAndRecv()
			if err != nil {
				t.Fatal(err)
			}
			if resp.Text != want {
				t.Fatalf("server joined %q, want %q", resp.Text, want)
			}
		})
		t.Run("bidi", func(t *testing.T) {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Echo")
			if err != nil {
				t.Fatal(err)
			}
			sent := make(chan error, 1)
			go func() {
				for i := range 1000 {
					if err := st.Send(&echopb.Echo{Text: strconv.Itoa(i), Payload: make([]byte, 1000)}); err != nil {
						sent <- err
						return
					}
				}
				sent <- st.CloseSend()
			}()
			for i := 0; ; i++ {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					if i != 1000 {
						t.Fatalf("stream ended after %d echoes, want 1000", i)
					}
					break
				}
				if err != nil {
					t.Fatalf("echo %d: %v", i, err)
				}
				if m.Text != strconv.Itoa(i) {
					t.Fatalf("echo %d is %q: out of order", i, m.Text)
				}
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		})
		t.Run("unary and streams share a connection", func(t *testing.T) {
			st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Echo")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			for i := range 50 {
				var resp echopb.Echo
				if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "u"}, &resp); err != nil || resp.Text != "u" {
					t.Fatalf("unary call %d beside a stream: %v %q", i, err, resp.Text)
				}
				if err := st.Send(&echopb.Echo{Text: "s"}); err != nil {
					t.Fatal(err)
				}
				if m, err := st.Recv(); err != nil || m.Text != "s" {
					t.Fatalf("stream echo %d: %v", i, err)
				}
			}
		})
	})
}

// Streams are frames, so they work over any transport: here the faulty
// transport holds every frame of both sides back by up to 2ms, in order,
// stream data and credit included.
func TestStreamsOverADelayingTransport(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport = kernrpc.PluginConfig{Name: "faulty", Options: map[string]any{
		"delay": "200us", "delay_jitter": "2ms",
		"frames": []any{"request", "response", "cancel", "stream_data", "window_update"},
	}}
	cfg.Streams.Window = 4 << 10 // so that credit must come back, late, many times
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Echo")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := range 200 {
			if st.Send(&echopb.Echo{Text: strconv.Itoa(i), Payload: make([]byte, 512)}) != nil {
				return
			}
		}
		_ = st.CloseSend()
	}()
	for i := 0; ; i++ {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if i != 200 {
				t.Fatalf("stream ended after %d echoes, want 200", i)
			}
			return
		}
		if err != nil || m.Text != strconv.Itoa(i) {
			t.Fatalf("echo %d: %v %q", i, err, m.GetText())
		}
	}
}

// A server that sends no message sends the headers it set with its
// status (docs/protocol.md, "Streams"): Header returns them.
func TestStreamHeaderComesWithTheStatusWhenNoMessageCarriedIt(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := st.Header(); err != nil || h["count"] != "0" {
		t.Errorf("Header = %v, %v; want the count=0 the handler set", h, err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv = %v, want io.EOF", err)
	}
	if tr := st.Trailer(); tr["sent"] != "0" {
		t.Errorf("trailer = %v; want sent=0", tr)
	}
}
