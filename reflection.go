package kernrpc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kernrpc/kernrpc/internal/reflectpb"
	"github.com/kernrpc/kernrpc/kernel"
)

// The server reflection service a server serves when server.reflection is
// on (docs/reflection.md): ListServices lists what the server serves,
// FileContaining returns the file descriptors a tool needs to build
// requests and read responses without generated code. Its messages are
// those of kernrpc.reflection.v1 (internal/reflectpb/reflection.proto);
// the generic package asks it.
const (
	ReflectionService              = "kernrpc.reflection.v1.Reflection"
	ReflectionListServicesMethod   = ReflectionService + ".ListServices"
	ReflectionFileContainingMethod = ReflectionService + ".FileContaining"
)

// serviceOf is the service of a method name: everything before its last
// dot ("pkg.S" of "pkg.S.Say", "Echo" of "Echo.Echo"); "" for a name
// without one.
func serviceOf(method string) string {
	if i := strings.LastIndexByte(method, '.'); i >= 0 {
		return method[:i]
	}
	return ""
}

// reflectionFiles holds the file descriptors registered on one server
// (RegisterFileDescriptor) beyond protoregistry.GlobalFiles, where
// protoc-gen-go's output registers itself: a gateway serving methods from
// a descriptor set has no generated code to put them there.
type reflectionFiles struct {
	mu    sync.Mutex
	files *protoregistry.Files // nil until a file is registered
}

// RegisterFileDescriptor makes fd and the files it imports known to the
// server's reflection service, for methods served from descriptors rather
// than generated code (the generic package's Register does it). A file
// already known by its path is skipped; one declaring a name another file
// declares is refused, and with it fd and every file it brings. It may be
// called while the server serves.
func (s *Server) RegisterFileDescriptor(fd protoreflect.FileDescriptor) error {
	r := &s.reflection
	r.mu.Lock()
	defer r.mu.Unlock()
	// Into a copy, swapped in once every file went in: a refused import
	// must not leave fd, or the imports before it, half registered.
	// Setup work, so copying every file each time is cheap enough.
	next := new(protoregistry.Files)
	if r.files != nil {
		r.files.RangeFiles(func(f protoreflect.FileDescriptor) bool {
			_ = next.RegisterFile(f) // they went in together before
			return true
		})
	}
	for _, f := range withImports(fd) {
		if _, err := next.FindFileByPath(f.Path()); err == nil {
			continue
		}
		if err := next.RegisterFile(f); err != nil {
			return fmt.Errorf("kernrpc: RegisterFileDescriptor %q: %w", fd.Path(), err)
		}
	}
	r.files = next
	return nil
}

// findDescriptor looks a full name up in the server's own files, then in
// the global ones. The lookup holds the lock: RegisterFileDescriptor may
// add to the same protoregistry.Files while the server answers, and a
// Files other than GlobalFiles is not safe to read while written.
func (s *Server) findDescriptor(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d := s.findOwnDescriptor(name); d != nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(name)
}

func (s *Server) findOwnDescriptor(name protoreflect.FullName) protoreflect.Descriptor {
	r := &s.reflection
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.files == nil {
		return nil
	}
	d, err := r.files.FindDescriptorByName(name)
	if err != nil {
		return nil
	}
	return d
}

// withImports is fd followed by every file it imports, transitively, each
// once, breadth first. Placeholder files (imports a descriptor was built
// without) carry no declarations and are left out.
func withImports(fd protoreflect.FileDescriptor) []protoreflect.FileDescriptor {
	out := []protoreflect.FileDescriptor{fd}
	seen := map[string]bool{fd.Path(): true}
	for i := 0; i < len(out); i++ {
		imports := out[i].Imports()
		for j := range imports.Len() {
			f := imports.Get(j).FileDescriptor
			if f == nil || f.IsPlaceholder() || seen[f.Path()] {
				continue
			}
			seen[f.Path()] = true
			out = append(out, f)
		}
	}
	return out
}

func (s *Server) registerReflection() {
	Handle(s, ReflectionListServicesMethod, s.listServices)
	Handle(s, ReflectionFileContainingMethod, s.fileContaining)
}

// registeredKinds is the kind of every registered method, read under the
// lock: handlers may run while nothing registers any more, but a server
// not yet started may still be registering.
func (s *Server) registeredKinds() map[string]reflectpb.Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make(map[string]reflectpb.Kind, len(s.methods))
	for name, d := range s.methods {
		kinds[name] = kindOf(d)
	}
	return kinds
}

func kindOf(d *methodDesc) reflectpb.Kind {
	if d.stream == nil {
		return reflectpb.Kind_KIND_UNARY
	}
	switch d.stream.kind {
	case kernel.ClientStreaming:
		return reflectpb.Kind_KIND_CLIENT_STREAMING
	case kernel.ServerStreaming:
		return reflectpb.Kind_KIND_SERVER_STREAMING
	case kernel.BidiStreaming:
		return reflectpb.Kind_KIND_BIDI_STREAMING
	}
	return reflectpb.Kind_KIND_UNSPECIFIED
}

func (s *Server) listServices(context.Context, *reflectpb.ListServicesRequest) (*reflectpb.ListServicesResponse, error) {
	byService := map[string]*reflectpb.Service{}
	for name, kind := range s.registeredKinds() {
		svcName := serviceOf(name)
		svc := byService[svcName]
		if svc == nil {
			svc = s.describeService(svcName)
			byService[svcName] = svc
		}
		m := &reflectpb.Method{Name: name, Kind: kind}
		if svc.Described {
			s.describeMethod(m, svcName, name[len(svcName)+1:])
		}
		svc.Methods = append(svc.Methods, m)
	}
	resp := &reflectpb.ListServicesResponse{}
	for _, svc := range byService {
		slices.SortFunc(svc.Methods, func(a, b *reflectpb.Method) int { return strings.Compare(a.Name, b.Name) })
		resp.Services = append(resp.Services, svc)
	}
	slices.SortFunc(resp.Services, func(a, b *reflectpb.Service) int { return strings.Compare(a.Name, b.Name) })
	return resp, nil
}

// describeService is the service's entry, described when a service
// descriptor of that name is known.
func (s *Server) describeService(name string) *reflectpb.Service {
	svc := &reflectpb.Service{Name: name}
	if name == "" {
		return svc
	}
	if d, err := s.findDescriptor(protoreflect.FullName(name)); err == nil {
		if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
			svc.Described, svc.File = true, sd.ParentFile().Path()
		}
	}
	return svc
}

// describeMethod fills in m's message types from the descriptor of its
// service, if that declares it.
func (s *Server) describeMethod(m *reflectpb.Method, service, method string) {
	d, err := s.findDescriptor(protoreflect.FullName(service))
	if err != nil {
		return
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return
	}
	if md := sd.Methods().ByName(protoreflect.Name(method)); md != nil {
		m.InputType, m.OutputType = string(md.Input().FullName()), string(md.Output().FullName())
	}
}

func (s *Server) fileContaining(_ context.Context, req *reflectpb.FileContainingRequest) (*reflectpb.FileContainingResponse, error) {
	name := protoreflect.FullName(strings.TrimPrefix(req.GetSymbol(), "."))
	if !name.IsValid() {
		return nil, kernel.Errorf(kernel.InvalidArgument, "reflection: %q is not a full name (want e.g. pkg.Service, pkg.Service.Method or pkg.Message)", req.GetSymbol())
	}
	d, err := s.findDescriptor(name)
	if err != nil {
		return nil, kernel.Errorf(kernel.NotFound, "reflection: symbol %q is in no file this server knows", name)
	}
	resp := &reflectpb.FileContainingResponse{}
	for _, f := range withImports(d.ParentFile()) {
		b, err := proto.Marshal(protodesc.ToFileDescriptorProto(f))
		if err != nil {
			return nil, kernel.Errorf(kernel.Internal, "reflection: encode %s: %v", f.Path(), err)
		}
		resp.FileDescriptorProtos = append(resp.FileDescriptorProtos, b)
	}
	return resp, nil
}
