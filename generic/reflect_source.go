package generic

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/reflectpb"
	"github.com/kernrpc/kernrpc/kernel"
)

// ReflectionSource asks a server for descriptors through its reflection
// service (server.reflection on; kernrpc.ReflectionService). The files it
// has been sent are kept, so each is asked for once. Safe for concurrent
// use.
type ReflectionSource struct {
	client *kernrpc.Client
	opts   []kernrpc.CallOption

	mu     sync.Mutex
	protos map[string]*descriptorpb.FileDescriptorProto // by path: every file sent so far
	files  *protoregistry.Files                         // protos, resolved; nil until the first
}

// NewReflectionSource asks the server c calls, with opts on every call. c
// must use a codec that encodes protobuf messages (protobuf or json).
func NewReflectionSource(c *kernrpc.Client, opts ...kernrpc.CallOption) *ReflectionSource {
	return &ReflectionSource{client: c, opts: opts, protos: map[string]*descriptorpb.FileDescriptorProto{}}
}

// Services asks the server what it serves. A server without reflection
// answers Unimplemented; the error says to turn it on.
func (s *ReflectionSource) Services(ctx context.Context) ([]Service, error) {
	var resp reflectpb.ListServicesResponse
	if err := s.client.Call(ctx, kernrpc.ReflectionListServicesMethod, &reflectpb.ListServicesRequest{}, &resp, s.opts...); err != nil {
		return nil, reflectionError("list services", err)
	}
	out := make([]Service, 0, len(resp.Services))
	for _, svc := range resp.Services {
		one := Service{Name: svc.Name, Described: svc.Described, File: svc.File}
		for _, m := range svc.Methods {
			one.Methods = append(one.Methods, Method{Name: m.Name, Kind: kindFromProto(m.Kind),
				Input: protoreflect.FullName(m.InputType), Output: protoreflect.FullName(m.OutputType)})
		}
		out = append(out, one)
	}
	return out, nil
}

func kindFromProto(k reflectpb.Kind) Kind {
	switch k {
	case reflectpb.Kind_KIND_CLIENT_STREAMING:
		return ClientStreaming
	case reflectpb.Kind_KIND_SERVER_STREAMING:
		return ServerStreaming
	case reflectpb.Kind_KIND_BIDI_STREAMING:
		return BidiStreaming
	}
	return Unary
}

// reflectionError names what was asked, and says what to do when the
// server has no reflection service.
func reflectionError(what string, err error) error {
	if kernel.CodeOf(err) == kernel.Unimplemented {
		return fmt.Errorf("generic: reflection: %s: %w (does the server run with server.reflection: true?)", what, err)
	}
	return fmt.Errorf("generic: reflection: %s: %w", what, err)
}

// FindDescriptor returns the descriptor of name from the files the server
// has sent, asking it for the file defining name the first time.
func (s *ReflectionSource) FindDescriptor(ctx context.Context, name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d := s.lookup(name); d != nil {
		return d, nil
	}
	var resp reflectpb.FileContainingResponse
	if err := s.client.Call(ctx, kernrpc.ReflectionFileContainingMethod, &reflectpb.FileContainingRequest{Symbol: string(name)}, &resp, s.opts...); err != nil {
		if kernel.CodeOf(err) == kernel.NotFound {
			return nil, fmt.Errorf("generic: reflection: %q: %w on the server", name, ErrNotFound)
		}
		return nil, reflectionError(fmt.Sprintf("file containing %q", name), err)
	}
	if err := s.add(resp.FileDescriptorProtos); err != nil {
		return nil, fmt.Errorf("generic: reflection: file containing %q: %w", name, err)
	}
	if d := s.lookup(name); d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("generic: reflection: %q: %w in the files the server sent for it", name, ErrNotFound)
}

func (s *ReflectionSource) lookup(name protoreflect.FullName) protoreflect.Descriptor {
	s.mu.Lock()
	files := s.files
	s.mu.Unlock()
	if files == nil {
		return nil
	}
	d, err := files.FindDescriptorByName(name)
	if err != nil {
		return nil
	}
	return d
}

// add decodes the files sent and resolves them against those sent before:
// a file's imports may have come in an earlier answer.
func (s *ReflectionSource) add(raw [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Every file decodes before any is kept: a file kept from an answer
	// that failed would never be resolved, and the next answer sending it
	// would not be looked at.
	fds := make([]*descriptorpb.FileDescriptorProto, len(raw))
	for i, b := range raw {
		fds[i] = &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fds[i]); err != nil {
			return fmt.Errorf("the server sent a file descriptor that does not decode: %w", err)
		}
	}
	added := map[string]*descriptorpb.FileDescriptorProto{}
	var order []string
	for _, fd := range fds {
		if _, ok := s.protos[fd.GetName()]; ok {
			continue
		}
		if _, ok := added[fd.GetName()]; !ok {
			added[fd.GetName()] = fd
			order = append(order, fd.GetName())
		}
	}
	if len(added) == 0 {
		return nil
	}
	// The files resolved before are kept as they are, in a new set with the
	// new ones: a descriptor handed out earlier stays the one found for its
	// name (dynamicpb tells fields apart by descriptor), and the set
	// lookups read is never written, nor replaced unless all resolve.
	next := new(protoregistry.Files)
	if s.files != nil {
		var err error
		s.files.RangeFiles(func(f protoreflect.FileDescriptor) bool {
			err = next.RegisterFile(f)
			return err == nil
		})
		if err != nil {
			return fmt.Errorf("the files the server sent do not resolve: %w", err)
		}
	}
	// Each new file is resolved after the new files it imports.
	const (
		resolving = iota + 1
		resolved
	)
	state := map[string]int{}
	var resolve func(name string) error
	resolve = func(name string) error {
		fd := added[name]
		if fd == nil || state[name] == resolved {
			return nil // sent before (or never: NewFile says so)
		}
		if state[name] == resolving {
			return fmt.Errorf("import cycle through %q", name)
		}
		state[name] = resolving
		for _, dep := range fd.GetDependency() {
			if err := resolve(dep); err != nil {
				return err
			}
		}
		f, err := protodesc.NewFile(fd, next)
		if err == nil {
			err = next.RegisterFile(f)
		}
		if err != nil {
			return err
		}
		state[name] = resolved
		return nil
	}
	for _, name := range order {
		if err := resolve(name); err != nil {
			return fmt.Errorf("the files the server sent do not resolve: %w", err)
		}
	}
	for name, fd := range added {
		s.protos[name] = fd
	}
	s.files = next
	return nil
}
