package generic

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Errors a caller may branch on, wrapped by the ones this package returns.
var (
	// ErrNotFound: the source knows no descriptor of that name.
	ErrNotFound = errors.New("not found")
	// ErrUnknownService: the method's service is neither described nor
	// served.
	ErrUnknownService = errors.New("unknown service")
	// ErrUnknownMethod: the service has no method of that name.
	ErrUnknownMethod = errors.New("unknown method")
	// ErrNotDescribed: the server serves the method but has no descriptor
	// of its service (it was registered by name, as "Echo.Echo" is), so
	// its messages cannot be built.
	ErrNotDescribed = errors.New("served by name only, without a descriptor")
	// ErrBadJSON: a JSON request does not fit the method's input message.
	ErrBadJSON = errors.New("bad JSON request")
	// ErrBadDescriptorSet: a descriptor set file does not parse or resolve.
	ErrBadDescriptorSet = errors.New("bad descriptor set")
)

// Kind is how a method is called.
type Kind uint8

// The kinds of method, named as kernel.StreamKind names the streaming ones.
const (
	Unary           Kind = iota // one request, one response
	ClientStreaming             // many requests, one response
	ServerStreaming             // one request, many responses
	BidiStreaming               // many each way, independently
)

func (k Kind) String() string {
	switch k {
	case Unary:
		return "unary"
	case ClientStreaming:
		return "client-streaming"
	case ServerStreaming:
		return "server-streaming"
	case BidiStreaming:
		return "bidi-streaming"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// KindOf is how md is called.
func KindOf(md protoreflect.MethodDescriptor) Kind {
	switch {
	case md.IsStreamingClient() && md.IsStreamingServer():
		return BidiStreaming
	case md.IsStreamingClient():
		return ClientStreaming
	case md.IsStreamingServer():
		return ServerStreaming
	}
	return Unary
}

// Service is a service a source knows of.
type Service struct {
	// Name is the full name, e.g. "kernrpc.echo.v1.EchoService".
	Name string
	// Described is whether the source has the service's descriptor
	// (FindDescriptor finds it); a server's hand-registered methods are
	// known by name only.
	Described bool
	// File is the path of the file defining it, when described.
	File    string
	Methods []Method
}

// Method is a method a source knows of.
type Method struct {
	// Name is the kernrpc method name, the one calls use:
	// "<service>.<method>".
	Name string
	Kind Kind
	// Input and Output are the full names of its messages; empty when
	// the method is known by name only.
	Input, Output protoreflect.FullName
}

// Source is where the descriptors of the methods to call come from: a
// server, through its reflection service (NewReflectionSource), or a
// descriptor set file (LoadDescriptorSet).
type Source interface {
	// Services lists the services the source knows of, sorted by name,
	// each with its methods sorted by name.
	Services(ctx context.Context) ([]Service, error)
	// FindDescriptor returns the descriptor of a service, method,
	// message, enum or field by full name; an error wrapping ErrNotFound
	// when it has none.
	FindDescriptor(ctx context.Context, name protoreflect.FullName) (protoreflect.Descriptor, error)
}

// FindMethod returns the descriptor of method, a kernrpc method name
// ("pkg.Service.Method", or ".pkg.Service.Method"). An error wraps ErrUnknownService,
// ErrUnknownMethod or ErrNotDescribed, and says what the source knows.
func FindMethod(ctx context.Context, src Source, method string) (protoreflect.MethodDescriptor, error) {
	// A leading dot, as .proto files and describe write full names, names
	// the same method; the server's reflection accepts it too.
	method = strings.TrimPrefix(method, ".")
	dot := strings.LastIndexByte(method, '.')
	if dot <= 0 || dot == len(method)-1 {
		return nil, fmt.Errorf("generic: method %q: %w: want SERVICE.METHOD, e.g. kernrpc.echo.v1.EchoService.Say", method, ErrUnknownMethod)
	}
	service, name := method[:dot], method[dot+1:]
	d, err := src.FindDescriptor(ctx, protoreflect.FullName(service))
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		return nil, notDescribed(ctx, src, method, service)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("generic: method %q: %w: %s is %s, not a service", method, ErrUnknownService, service, descriptorKind(d))
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		var names []string
		for i := range sd.Methods().Len() {
			names = append(names, string(sd.Methods().Get(i).Name()))
		}
		return nil, fmt.Errorf("generic: method %q: %w: service %s has %s", method, ErrUnknownMethod, service, listOr(names, "no methods"))
	}
	return md, nil
}

// notDescribed is the error for a method whose service has no
// descriptor: served by name only, or not served at all.
func notDescribed(ctx context.Context, src Source, method, service string) error {
	svcs, err := src.Services(ctx)
	if err != nil {
		return fmt.Errorf("generic: method %q: %w %q (and listing the services failed: %v)", method, ErrUnknownService, service, err)
	}
	var names []string
	for _, s := range svcs {
		if s.Name != service {
			names = append(names, s.Name)
			continue
		}
		if slices.ContainsFunc(s.Methods, func(m Method) bool { return m.Name == method }) {
			return fmt.Errorf("generic: method %q: %w; call it with generated types, or serve its service from a .proto", method, ErrNotDescribed)
		}
		return fmt.Errorf("generic: method %q: %w: service %s is %w", method, ErrUnknownMethod, service, ErrNotDescribed)
	}
	return fmt.Errorf("generic: method %q: %w %q; known: %s", method, ErrUnknownService, service, listOr(names, "none"))
}

func descriptorKind(d protoreflect.Descriptor) string {
	switch d.(type) {
	case protoreflect.MessageDescriptor:
		return "a message"
	case protoreflect.EnumDescriptor:
		return "an enum"
	case protoreflect.MethodDescriptor:
		return "a method"
	case protoreflect.FieldDescriptor:
		return "a field"
	case protoreflect.EnumValueDescriptor:
		return "an enum value"
	}
	return "a declaration"
}

func listOr(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return strings.Join(names, ", ")
}

// FilesSource is a Source over a set of resolved files: those of a
// descriptor set, or protoregistry.GlobalFiles.
type FilesSource struct {
	files *protoregistry.Files
}

var (
	_ Source = (*FilesSource)(nil)
	_ Source = (*ReflectionSource)(nil)
)

// NewFilesSource is a Source over files.
func NewFilesSource(files *protoregistry.Files) *FilesSource { return &FilesSource{files: files} }

// LoadDescriptorSet reads a descriptor set file, as `protoc
// --descriptor_set_out=FILE --include_imports` writes it. An error for a
// file that does not parse or resolve wraps ErrBadDescriptorSet.
func LoadDescriptorSet(path string) (*FilesSource, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("generic: descriptor set: %w", err)
	}
	files, err := parseDescriptorSet(b)
	if err != nil {
		return nil, fmt.Errorf("generic: descriptor set %s: %w", path, err)
	}
	return NewFilesSource(files), nil
}

// ParseDescriptorSet parses a serialized google.protobuf.FileDescriptorSet
// holding every file its files import.
func ParseDescriptorSet(b []byte) (*FilesSource, error) {
	files, err := parseDescriptorSet(b)
	if err != nil {
		return nil, fmt.Errorf("generic: descriptor set: %w", err)
	}
	return NewFilesSource(files), nil
}

func parseDescriptorSet(b []byte) (*protoregistry.Files, error) {
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(b, set); err != nil {
		return nil, fmt.Errorf("%w: not a serialized FileDescriptorSet (protoc --descriptor_set_out): %v", ErrBadDescriptorSet, err)
	}
	if len(set.File) == 0 {
		return nil, fmt.Errorf("%w: it holds no file", ErrBadDescriptorSet)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("%w: %v (was it written with --include_imports?)", ErrBadDescriptorSet, err)
	}
	return files, nil
}

// Files is the set the source looks names up in.
func (s *FilesSource) Files() *protoregistry.Files { return s.files }

// Services lists every service the files declare, described.
func (s *FilesSource) Services(context.Context) ([]Service, error) {
	var out []Service
	s.files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			out = append(out, describedService(fd.Services().Get(i)))
		}
		return true
	})
	slices.SortFunc(out, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func describedService(sd protoreflect.ServiceDescriptor) Service {
	svc := Service{Name: string(sd.FullName()), Described: true, File: sd.ParentFile().Path()}
	for j := range sd.Methods().Len() {
		md := sd.Methods().Get(j)
		svc.Methods = append(svc.Methods, Method{Name: string(md.FullName()), Kind: KindOf(md), Input: md.Input().FullName(), Output: md.Output().FullName()})
	}
	slices.SortFunc(svc.Methods, func(a, b Method) int { return strings.Compare(a.Name, b.Name) })
	return svc
}

// FindDescriptor looks name up in the files.
func (s *FilesSource) FindDescriptor(_ context.Context, name protoreflect.FullName) (protoreflect.Descriptor, error) {
	d, err := s.files.FindDescriptorByName(name)
	if err != nil {
		return nil, fmt.Errorf("generic: %q: %w in the descriptor set", name, ErrNotFound)
	}
	return d, nil
}
