package generic_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
)

// startNotes serves kernrpc.reflecttest.v1.Notes.Echo with generated
// types, as any service would, and the reflection service beside it.
func startNotes() *kernrpc.Server {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "notes"
	cfg.Server.Reflection = true // serve kernrpc.reflection.v1.Reflection
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	kernrpc.Handle(srv, "kernrpc.reflecttest.v1.Notes.Echo", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) { return n, nil })
	if err := srv.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	return srv
}

// dial is a client of the server at addr, by address.
func dial(service, addr string) *kernrpc.Client {
	cfg := kernrpc.DefaultConfig()
	cfg.Registry.Options = map[string]any{"static": map[string]any{service: []any{addr}}}
	cli, err := kernrpc.NewClient(cfg, service)
	if err != nil {
		log.Fatal(err)
	}
	return cli
}

// A client with nothing but a server's address calls a method by name,
// with a JSON request: the descriptors come from the server's reflection
// service.
func ExampleClient_CallJSON() {
	srv := startNotes()
	defer srv.Shutdown(context.Background())
	ctx := context.Background()

	cli := dial("notes", srv.Addr())
	defer cli.Close()
	g := generic.NewClient(cli, generic.NewReflectionSource(cli))
	resp, err := g.CallJSON(ctx, "kernrpc.reflecttest.v1.Notes.Echo", []byte(`{"text": "hi", "color": "COLOR_RED"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp))

	// A request that does not fit the message fails before it is sent.
	_, err = g.CallJSON(ctx, "kernrpc.reflecttest.v1.Notes.Echo", []byte(`{"txt": "hi"}`))
	fmt.Println(errors.Is(err, generic.ErrBadJSON), err)
	// Output:
	// {"text":"hi","color":"COLOR_RED"}
	// true generic: request of kernrpc.reflecttest.v1.Notes.Echo: bad JSON request for kernrpc.reflecttest.v1.Note: (line 1:2): unknown field "txt"
}

// A gateway serves a method from a descriptor set, with no generated
// code; its reflection service then describes it as any other.
func ExampleRegister() {
	set, err := generic.LoadDescriptorSet("../internal/reflectpb/testpb/testdata/gateway.protoset")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	d, err := set.FindDescriptor(ctx, "kernrpc.gatewaytest.v1.Relay.Greet")
	if err != nil {
		log.Fatal(err)
	}
	greet := d.(protoreflect.MethodDescriptor)
	name := greet.Input().Fields().ByName("name")

	cfg := kernrpc.DefaultConfig()
	cfg.Service = "relay"
	cfg.Server.Reflection = true
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		log.Fatal(err)
	}
	err = generic.Register(srv, greet, func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error) {
		resp := dynamicpb.NewMessage(greet.Output())
		resp.Set(name, protoreflect.ValueOfString("hello, "+req.Get(name).String()))
		return resp, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)

	cli := dial("relay", srv.Addr())
	defer cli.Close()
	g := generic.NewClient(cli, generic.NewReflectionSource(cli))
	resp, err := g.CallJSON(ctx, "kernrpc.gatewaytest.v1.Relay.Greet", []byte(`{"name": "ann"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp))
	// Output: {"name":"hello, ann"}
}
