package kernrpc_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/reflectpb"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
	"github.com/kernrpc/kernrpc/kernel"
)

// notesServer serves kernrpc.reflecttest.v1.Notes, one method of each
// kind, plus a method of that service its descriptor does not declare.
func notesServer(t *testing.T, reflection bool, extra func(*kernrpc.Server)) *kernrpc.Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.Server.Reflection = reflection
	const svc = "kernrpc.reflecttest.v1.Notes."
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, svc+"Echo", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) { return n, nil })
		kernrpc.Handle(s, svc+"Undeclared", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) { return n, nil })
		kernrpc.HandleServerStream(s, svc+"Split", func(_ context.Context, n *testpb.Note, st kernrpc.ServerStreamOf[testpb.Note, testpb.Note]) error {
			return nil
		})
		kernrpc.HandleClientStream(s, svc+"Join", func(_ context.Context, st kernrpc.ServerStreamOf[testpb.Note, testpb.Note]) (*testpb.Note, error) {
			return &testpb.Note{}, nil
		})
		kernrpc.HandleBidiStream(s, svc+"Chat", func(_ context.Context, st kernrpc.ServerStreamOf[testpb.Note, testpb.Note]) error { return nil })
		if extra != nil {
			extra(s)
		}
	})
	return cfg
}

func listServices(t *testing.T, cli *kernrpc.Client) map[string]*reflectpb.Service {
	t.Helper()
	var resp reflectpb.ListServicesResponse
	if err := cli.Call(context.Background(), kernrpc.ReflectionListServicesMethod, &reflectpb.ListServicesRequest{}, &resp); err != nil {
		t.Fatalf("ListServices: %v", err)
	}
	out := map[string]*reflectpb.Service{}
	var names []string
	for _, s := range resp.Services {
		out[s.Name] = s
		names = append(names, s.Name)
	}
	if !slices.IsSorted(names) {
		t.Errorf("services are not sorted: %q", names)
	}
	return out
}

func TestReflectionIsOffByDefault(t *testing.T) {
	cfg := notesServer(t, false, nil)
	cli := newClient(t, cfg)
	err := cli.Call(context.Background(), kernrpc.ReflectionListServicesMethod, &reflectpb.ListServicesRequest{}, new(reflectpb.ListServicesResponse))
	if kernel.CodeOf(err) != kernel.Unimplemented {
		t.Fatalf("ListServices on a server without server.reflection: %v, want Unimplemented", err)
	}
}

func TestReflectionIsOnByConfig(t *testing.T) {
	cfg, err := kernrpc.ParseConfig([]byte("service: echo\nserver: {reflection: true}\n"), "reflect.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Server.Reflection {
		t.Fatal("server.reflection: true did not set Server.Reflection")
	}
	if _, err := kernrpc.ParseConfig([]byte("server: {reflection: maybe}\n"), "bad.yaml"); err == nil || !strings.Contains(err.Error(), "reflection") {
		t.Errorf("server.reflection: maybe: %v, want an error naming the option", err)
	}
}

func TestReflectionListsServicesWithTheirMethods(t *testing.T) {
	cfg := notesServer(t, true, nil)
	svcs := listServices(t, newClient(t, cfg))

	notes := svcs["kernrpc.reflecttest.v1.Notes"]
	if notes == nil || !notes.Described || notes.File != "internal/reflectpb/testpb/service.proto" {
		t.Fatalf("Notes: %v, want it described from internal/reflectpb/testpb/service.proto", notes)
	}
	const note = "kernrpc.reflecttest.v1.Note"
	want := []*reflectpb.Method{
		{Name: "kernrpc.reflecttest.v1.Notes.Chat", Kind: reflectpb.Kind_KIND_BIDI_STREAMING, InputType: note, OutputType: note},
		{Name: "kernrpc.reflecttest.v1.Notes.Echo", Kind: reflectpb.Kind_KIND_UNARY, InputType: note, OutputType: note},
		{Name: "kernrpc.reflecttest.v1.Notes.Join", Kind: reflectpb.Kind_KIND_CLIENT_STREAMING, InputType: note, OutputType: note},
		{Name: "kernrpc.reflecttest.v1.Notes.Split", Kind: reflectpb.Kind_KIND_SERVER_STREAMING, InputType: note, OutputType: note},
		// Served, but not in the service's descriptor: by name only.
		{Name: "kernrpc.reflecttest.v1.Notes.Undeclared", Kind: reflectpb.Kind_KIND_UNARY},
	}
	if len(notes.Methods) != len(want) {
		t.Fatalf("Notes methods: %v, want %v", notes.Methods, want)
	}
	for i, w := range want {
		if !proto.Equal(notes.Methods[i], w) {
			t.Errorf("method %d: %v, want %v", i, notes.Methods[i], w)
		}
	}

	// Hand-registered names have no descriptor: listed by name only.
	echo := svcs["Echo"]
	if echo == nil || echo.Described || len(echo.Methods) != 1 || echo.Methods[0].Name != "Echo.Echo" || echo.Methods[0].InputType != "" {
		t.Errorf("Echo: %v, want Echo.Echo listed by name only", echo)
	}
	if h := svcs["kernrpc.Health"]; h == nil || h.Described || len(h.Methods) != 1 || h.Methods[0].Name != kernrpc.HealthCheckMethod {
		t.Errorf("kernrpc.Health: %v, want its Check method listed", h)
	}
	refl := svcs[kernrpc.ReflectionService]
	if refl == nil || !refl.Described || len(refl.Methods) != 2 || refl.Methods[0].InputType != "kernrpc.reflection.v1.FileContainingRequest" {
		t.Errorf("%s: %v, want itself described", kernrpc.ReflectionService, refl)
	}
}

// fileContaining asks for symbol and returns the files' paths in the
// order sent, and the files resolved together.
func fileContaining(t *testing.T, cli *kernrpc.Client, symbol string) ([]string, protodescFiles, error) {
	t.Helper()
	var resp reflectpb.FileContainingResponse
	if err := cli.Call(context.Background(), kernrpc.ReflectionFileContainingMethod, &reflectpb.FileContainingRequest{Symbol: symbol}, &resp); err != nil {
		return nil, nil, err
	}
	set := &descriptorpb.FileDescriptorSet{}
	var paths []string
	for _, b := range resp.FileDescriptorProtos {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatalf("FileContaining(%s): a file that does not decode: %v", symbol, err)
		}
		paths = append(paths, fd.GetName())
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("FileContaining(%s): the files sent do not resolve on their own: %v", symbol, err)
	}
	return paths, files, nil
}

type protodescFiles interface {
	FindDescriptorByName(protoreflect.FullName) (protoreflect.Descriptor, error)
}

func TestReflectionFileContaining(t *testing.T) {
	cfg := notesServer(t, true, nil)
	cli := newClient(t, cfg)
	const (
		service = "internal/reflectpb/testpb/service.proto"
		types   = "internal/reflectpb/testpb/types.proto"
		ts      = "google/protobuf/timestamp.proto"
	)
	for _, tc := range []struct {
		symbol string
		paths  []string
	}{
		{"kernrpc.reflecttest.v1.Notes", []string{service, types, ts}},
		{"kernrpc.reflecttest.v1.Notes.Split", []string{service, types, ts}},
		{".kernrpc.reflecttest.v1.Notes", []string{service, types, ts}},
		{"kernrpc.reflecttest.v1.Note.Meta", []string{types, ts}},
		{"kernrpc.reflecttest.v1.Color", []string{types, ts}},
		{"google.protobuf.Timestamp", []string{ts}},
	} {
		paths, files, err := fileContaining(t, cli, tc.symbol)
		if err != nil {
			t.Errorf("FileContaining(%s): %v", tc.symbol, err)
			continue
		}
		if !slices.Equal(paths, tc.paths) {
			t.Errorf("FileContaining(%s) sent %q, want %q", tc.symbol, paths, tc.paths)
		}
		if _, err := files.FindDescriptorByName(protoreflect.FullName(strings.TrimPrefix(tc.symbol, "."))); err != nil {
			t.Errorf("FileContaining(%s): the symbol is not in the files sent: %v", tc.symbol, err)
		}
	}
	_, files, err := fileContaining(t, cli, "kernrpc.reflecttest.v1.Notes.Chat")
	if err != nil {
		t.Fatal(err)
	}
	d, _ := files.FindDescriptorByName("kernrpc.reflecttest.v1.Notes.Chat")
	if md := d.(protoreflect.MethodDescriptor); !md.IsStreamingClient() || !md.IsStreamingServer() || md.Input().Fields().ByName("meta").Message().FullName() != "kernrpc.reflecttest.v1.Note.Meta" {
		t.Errorf("Chat as sent: %v", md)
	}

	for _, tc := range []struct {
		symbol string
		code   kernel.Code
	}{
		{"kernrpc.reflecttest.v1.Nope", kernel.NotFound},
		{"Echo", kernel.NotFound}, // served, but by name only
		{"", kernel.InvalidArgument},
		{"not a name!", kernel.InvalidArgument},
	} {
		if _, _, err := fileContaining(t, cli, tc.symbol); kernel.CodeOf(err) != tc.code || !strings.Contains(err.Error(), "reflection:") {
			t.Errorf("FileContaining(%q): %v, want %v from the reflection service", tc.symbol, err, tc.code)
		}
	}
}

// loadGatewayFile reads the descriptor set of a service no Go code is
// generated for.
func loadGatewayFile(t *testing.T) protoreflect.FileDescriptor {
	t.Helper()
	b, err := os.ReadFile("internal/reflectpb/testpb/testdata/gateway.protoset")
	if err != nil {
		t.Fatal(err)
	}
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(b, set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := files.FindFileByPath("gateway.proto")
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// A server that serves a method from a descriptor set, with no generated
// code, describes it once it registers the file.
func TestReflectionDescribesRegisteredFiles(t *testing.T) {
	fd := loadGatewayFile(t)
	greet := fd.Services().ByName("Relay").Methods().ByName("Greet")
	var regErr, again error
	cfg := notesServer(t, true, func(s *kernrpc.Server) {
		in := greet.Input()
		if err := s.Register(string(greet.FullName()), func() any { return dynamicpb.NewMessage(in) }, func(_ context.Context, req any) (any, error) {
			return req, nil
		}); err != nil {
			t.Fatal(err)
		}
		regErr = s.RegisterFileDescriptor(fd)
		again = s.RegisterFileDescriptor(fd) // already known: nothing to do
	})
	if regErr != nil || again != nil {
		t.Fatalf("RegisterFileDescriptor: %v; again: %v", regErr, again)
	}
	cli := newClient(t, cfg)
	relay := listServices(t, cli)["kernrpc.gatewaytest.v1.Relay"]
	if relay == nil || !relay.Described || relay.File != "gateway.proto" || len(relay.Methods) != 1 ||
		relay.Methods[0].InputType != "kernrpc.gatewaytest.v1.Hello" {
		t.Fatalf("Relay: %v, want Greet described from gateway.proto", relay)
	}
	paths, _, err := fileContaining(t, cli, "kernrpc.gatewaytest.v1.Hello")
	if err != nil || !slices.Equal(paths, []string{"gateway.proto", "google/protobuf/duration.proto"}) {
		t.Errorf("FileContaining(Hello): %q, %v", paths, err)
	}
}

func TestRegisterFileDescriptorRefusesAConflictingFile(t *testing.T) {
	fd := loadGatewayFile(t)
	// The same declarations under another path.
	fdp := protodesc.ToFileDescriptorProto(fd)
	fdp.Name = proto.String("elsewhere/gateway.proto")
	imports := new(protoregistry.Files)
	if err := imports.RegisterFile(fd.Imports().Get(0).FileDescriptor); err != nil {
		t.Fatal(err)
	}
	other, err := protodesc.NewFile(fdp, imports)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := kernrpc.NewServer(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	if err := srv.RegisterFileDescriptor(fd); err != nil {
		t.Fatal(err)
	}
	err = srv.RegisterFileDescriptor(other)
	if err == nil || !strings.Contains(err.Error(), "elsewhere/gateway.proto") || !strings.Contains(err.Error(), "kernrpc.gatewaytest.v1") {
		t.Fatalf("registering a second file declaring the same names: %v, want an error naming the file and the name", err)
	}
}

// A file refused because one of its imports conflicts is refused whole:
// the reflection service does not describe the file itself, half
// registered.
func TestRegisterFileDescriptorRefusesAllOrNothing(t *testing.T) {
	fd := loadGatewayFile(t)
	conflicting := fileLike(t, fd, "elsewhere/gateway.proto", "", fd.Imports().Get(0).FileDescriptor)
	// A file of its own importing the conflicting one.
	extra := fileLike(t, nil, "extra.proto", "kernrpc.extratest.v1", conflicting)
	var first, refused error
	cfg := notesServer(t, true, func(s *kernrpc.Server) {
		first = s.RegisterFileDescriptor(fd)
		refused = s.RegisterFileDescriptor(extra)
	})
	if first != nil || refused == nil || !strings.Contains(refused.Error(), "elsewhere/gateway.proto") {
		t.Fatalf("RegisterFileDescriptor: %v, then %v; want the second refused for its import", first, refused)
	}
	cli := newClient(t, cfg)
	if _, _, err := fileContaining(t, cli, "kernrpc.extratest.v1.Extra"); kernel.CodeOf(err) != kernel.NotFound {
		t.Errorf("FileContaining(Extra) after its file was refused: %v, want NotFound", err)
	}
}

// fileLike builds a file at path: a copy of like's declarations, or, with
// like nil, one message Extra in pkg; it imports the files given.
func fileLike(t *testing.T, like protoreflect.FileDescriptor, path, pkg string, imports ...protoreflect.FileDescriptor) protoreflect.FileDescriptor {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{Syntax: proto.String("proto3"), Package: proto.String(pkg),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Extra")}}}
	if like != nil {
		fdp = protodesc.ToFileDescriptorProto(like)
	}
	fdp.Name = proto.String(path)
	fdp.Dependency = nil
	deps := new(protoregistry.Files)
	for _, imp := range imports {
		fdp.Dependency = append(fdp.Dependency, imp.Path())
		if err := deps.RegisterFile(imp); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := protodesc.NewFile(fdp, deps)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// RegisterFileDescriptor may run while the server answers reflection
// requests (a gateway loading another descriptor set): the files it adds
// are read by none of them half written.
func TestRegisterFileDescriptorWhileServing(t *testing.T) {
	var srv *kernrpc.Server
	cfg := notesServer(t, true, func(s *kernrpc.Server) { srv = s })
	cli := newClient(t, cfg)
	stop := make(chan struct{})
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var resp reflectpb.FileContainingResponse
			_ = cli.Call(context.Background(), kernrpc.ReflectionFileContainingMethod, &reflectpb.FileContainingRequest{Symbol: "late.v1.M"}, &resp)
		}
	}()
	for i := range 200 {
		name := fmt.Sprintf("M%d", i)
		fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
			Name: proto.String(name + ".proto"), Package: proto.String("late.v1"), Syntax: proto.String("proto3"),
			MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String(name)}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.RegisterFileDescriptor(fd); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Microsecond)
	}
	close(stop)
	<-asked
	if _, _, err := fileContaining(t, cli, "late.v1.M199"); err != nil {
		t.Errorf("FileContaining(late.v1.M199) once registered: %v", err)
	}
}
