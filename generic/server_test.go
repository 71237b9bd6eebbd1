package generic_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/kernel"
)

// relay is kernrpc.gatewaytest.v1.Relay, which no Go code is generated
// for: only its descriptor set exists.
func relay(t testing.TB) protoreflect.ServiceDescriptor {
	t.Helper()
	src, err := generic.LoadDescriptorSet(gatewaySet)
	if err != nil {
		t.Fatal(err)
	}
	d, err := src.FindDescriptor(context.Background(), "kernrpc.gatewaytest.v1.Relay")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := protoregistry.GlobalFiles.FindDescriptorByName("kernrpc.gatewaytest.v1.Relay"); err == nil {
		t.Fatal("Relay is in protoregistry.GlobalFiles: the test would not show serving from a descriptor alone")
	}
	return d.(protoreflect.ServiceDescriptor)
}

// serveRelay serves Greet (answers "hello, NAME") and Count (sends NAME
// `times` times) from Relay's descriptor alone.
func serveRelay(s *kernrpc.Server, sd protoreflect.ServiceDescriptor) error {
	greet, count := sd.Methods().ByName("Greet"), sd.Methods().ByName("Count")
	hello := greet.Input()
	name, times := hello.Fields().ByName("name"), hello.Fields().ByName("times")
	err := generic.Register(s, greet, func(_ context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		if req.Get(name).String() == "" {
			return nil, kernel.Errorf(kernel.InvalidArgument, "name is empty")
		}
		resp := dynamicpb.NewMessage(greet.Output())
		resp.Set(name, protoreflect.ValueOfString("hello, "+req.Get(name).String()))
		return resp, nil
	})
	if err != nil {
		return err
	}
	return generic.RegisterStream(s, count, func(_ context.Context, st *generic.ServerStream) error {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		for i := range req.Get(times).Int() {
			m := dynamicpb.NewMessage(count.Output())
			m.Set(name, req.Get(name))
			m.Set(times, protoreflect.ValueOfInt64(i+1))
			if err := st.Send(m); err != nil {
				return err
			}
		}
		return nil
	})
}

// A gateway serves a service from its descriptor set, and a client that
// has nothing but the server's reflection calls it.
func TestServeFromADescriptorAlone(t *testing.T) {
	for _, codec := range []string{"protobuf", "json"} {
		t.Run(codec, func(t *testing.T) {
			sd := relay(t)
			var regErr error
			g := reflectingClient(t, codec, func(s *kernrpc.Server) { regErr = serveRelay(s, sd) })
			if regErr != nil {
				t.Fatal(regErr)
			}
			ctx := context.Background()
			got, err := g.CallJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Greet", []byte(`{"name":"ann","wait":"1.5s"}`))
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got, `{"name":"hello, ann"}`)
			if _, err := g.CallJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Greet", []byte(`{}`)); kernel.CodeOf(err) != kernel.InvalidArgument {
				t.Errorf("the handler's status: %v, want InvalidArgument", err)
			}
			var msgs []string
			err = g.ServerStreamJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Count", []byte(`{"name":"bo","times":3}`), func(b []byte) error {
				msgs = append(msgs, string(b))
				return nil
			})
			if err != nil || strings.Join(msgs, " ") != `{"name":"bo","times":"1"} {"name":"bo","times":"2"} {"name":"bo","times":"3"}` {
				t.Errorf("Count: %q, %v", msgs, err)
			}
			svcs, err := g.Source().Services(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range svcs {
				if s.Name == "kernrpc.gatewaytest.v1.Relay" && (!s.Described || s.File != "gateway.proto" || len(s.Methods) != 2 || s.Methods[0].Kind != generic.ServerStreaming) {
					t.Errorf("reflection lists Relay as %+v", s)
				}
			}
		})
	}
}

// A handler's answer of another type than the method's output is an
// Internal error, not bytes the client would misread.
func TestHandlerAnsweringTheWrongTypeIsInternal(t *testing.T) {
	sd := relay(t)
	greet, count := sd.Methods().ByName("Greet"), sd.Methods().ByName("Count")
	duration := greet.Input().Fields().ByName("wait").Message()
	var errs []error
	g := reflectingClient(t, "protobuf", func(s *kernrpc.Server) {
		errs = append(errs,
			generic.Register(s, greet, func(context.Context, *dynamicpb.Message) (*dynamicpb.Message, error) {
				return dynamicpb.NewMessage(duration), nil
			}),
			generic.RegisterStream(s, count, func(_ context.Context, st *generic.ServerStream) error {
				if _, err := st.Recv(); err != nil {
					return err
				}
				if err := st.Send(dynamicpb.NewMessage(duration)); err != nil {
					return err
				}
				return errors.New("unreachable: Send took a message of the wrong type")
			}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := g.CallJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Greet", []byte(`{"name":"x"}`))
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "answered with a google.protobuf.Duration, want a kernrpc.gatewaytest.v1.Hello") {
		t.Errorf("Greet: %v", err)
	}
	err = g.ServerStreamJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Count", []byte(`{}`), func([]byte) error { return nil })
	if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), "google.protobuf.Duration") {
		t.Errorf("Count: %v", err)
	}
}

func TestRegisterErrors(t *testing.T) {
	sd := relay(t)
	greet, count := sd.Methods().ByName("Greet"), sd.Methods().ByName("Count")
	srv, err := kernrpc.NewServer(config(t, "protobuf", true))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	noop := func(context.Context, *dynamicpb.Message) (*dynamicpb.Message, error) { return nil, nil }
	noopStream := func(context.Context, *generic.ServerStream) error { return nil }
	if err := generic.Register(srv, count, noop); err == nil || !strings.Contains(err.Error(), "server-streaming: use RegisterStream") {
		t.Errorf("Register of a streaming method: %v", err)
	}
	if err := generic.RegisterStream(srv, greet, noopStream); err == nil || !strings.Contains(err.Error(), "unary: use Register") {
		t.Errorf("RegisterStream of a unary method: %v", err)
	}
	if err := generic.Register(srv, greet, noop); err != nil {
		t.Fatal(err)
	}
	if err := generic.Register(srv, greet, noop); err == nil || !strings.Contains(err.Error(), "registered twice") {
		t.Errorf("registering twice: %v", err)
	}
}

// A method whose file the server refuses (its names are another file's)
// is not served either: Register fails whole.
func TestRegisterRefusedFileServesNothing(t *testing.T) {
	sd := relay(t)
	greet, count := sd.Methods().ByName("Greet"), sd.Methods().ByName("Count")
	srv, err := kernrpc.NewServer(config(t, "protobuf", true))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	// The same declarations under another path, known to the server first.
	fdp := protodesc.ToFileDescriptorProto(greet.ParentFile())
	fdp.Name = proto.String("elsewhere/gateway.proto")
	imports := new(protoregistry.Files)
	for i := range greet.ParentFile().Imports().Len() {
		if err := imports.RegisterFile(greet.ParentFile().Imports().Get(i).FileDescriptor); err != nil {
			t.Fatal(err)
		}
	}
	elsewhere, err := protodesc.NewFile(fdp, imports)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.RegisterFileDescriptor(elsewhere); err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, *dynamicpb.Message) (*dynamicpb.Message, error) { return nil, nil }
	noopStream := func(context.Context, *generic.ServerStream) error { return nil }
	if err := generic.Register(srv, greet, noop); err == nil || !strings.Contains(err.Error(), "name conflict") {
		t.Errorf("Register from a file the server refuses: %v, want the conflict named", err)
	}
	if err := generic.RegisterStream(srv, count, noopStream); err == nil {
		t.Error("RegisterStream from a file the server refuses succeeded")
	}
	if m := srv.Methods(); slices.Contains(m, string(greet.FullName())) || slices.Contains(m, string(count.FullName())) {
		t.Errorf("methods served after their file was refused: %q", m)
	}
}

// A client-streaming method served generically: the handler reads every
// message, then sends the one response.
func TestRegisterClientStream(t *testing.T) {
	src, err := generic.LoadDescriptorSet(notesSet)
	if err != nil {
		t.Fatal(err)
	}
	join, err := generic.FindMethod(context.Background(), src, notes+"Join")
	if err != nil {
		t.Fatal(err)
	}
	text := join.Input().Fields().ByName("text")
	cfg := config(t, "protobuf", false)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = generic.RegisterStream(srv, join, func(_ context.Context, st *generic.ServerStream) error {
		if st.Method() != join {
			return kernel.Errorf(kernel.Internal, "the stream's method is %s, want %s", st.Method().FullName(), join.FullName())
		}
		var all []string
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			all = append(all, m.Get(text).String())
		}
		resp := dynamicpb.NewMessage(join.Output())
		resp.Set(text, protoreflect.ValueOfString(strings.Join(all, "+")))
		return st.Send(resp)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	g := generic.NewClient(newClient(t, cfg), src)
	st, err := g.OpenStream(context.Background(), notes+"Join")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b", "c"} {
		m := dynamicpb.NewMessage(join.Input())
		m.Set(text, protoreflect.ValueOfString(s))
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.Get(text).String() != "a+b+c" {
		t.Fatalf("Join: %v, %v", resp, err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the response: %v, want io.EOF", err)
	}
}
