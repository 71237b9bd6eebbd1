package generic_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/codec/json"
)

// The tests start servers and clients: none of their goroutines may
// outlive them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// config gives each test its own registry namespace.
func config(t testing.TB, codec string, reflection bool) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "notes"
	cfg.Codec.Name = codec
	cfg.Registry.Options = map[string]any{"namespace": t.Name()}
	cfg.Server.Reflection = reflection
	return cfg
}

const notes = "kernrpc.reflecttest.v1.Notes."

// serveNotes serves kernrpc.reflecttest.v1.Notes with generated types,
// one method of each kind, plus Echo.Echo by name only, and extra's.
func serveNotes(t testing.TB, cfg *kernrpc.Config, extra func(*kernrpc.Server)) {
	t.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, notes+"Echo", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) {
		if n.Text == "fail" {
			return nil, kernel.Errorf(kernel.NotFound, "no note %q", n.Text)
		}
		return n, nil
	})
	kernrpc.HandleServerStream(srv, notes+"Split", func(_ context.Context, n *testpb.Note, st kernrpc.ServerStreamOf[testpb.Note, testpb.Note]) error {
		for _, tag := range n.Tags {
			if err := st.Send(&testpb.Note{Text: tag}); err != nil {
				return err
			}
		}
		if n.Text == "fail" {
			return kernel.Errorf(kernel.FailedPrecondition, "failed after %d notes", len(n.Tags))
		}
		return nil
	})
	kernrpc.HandleBidiStream(srv, notes+"Chat", func(_ context.Context, st kernrpc.ServerStreamOf[testpb.Note, testpb.Note]) error {
		for {
			n, err := st.Recv()
			if err != nil {
				return nil // io.EOF: the client is done
			}
			if err := st.Send(&testpb.Note{Text: "re: " + n.Text}); err != nil {
				return err
			}
		}
	})
	kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) { return n, nil })
	if extra != nil {
		extra(srv)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
}

func newClient(t testing.TB, cfg *kernrpc.Config) *kernrpc.Client {
	t.Helper()
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// reflectingClient serves Notes with reflection on and returns a generic
// client that finds descriptors through it.
func reflectingClient(t testing.TB, codec string, extra func(*kernrpc.Server)) *generic.Client {
	t.Helper()
	cfg := config(t, codec, true)
	serveNotes(t, cfg, extra)
	cli := newClient(t, cfg)
	return generic.NewClient(cli, generic.NewReflectionSource(cli))
}
