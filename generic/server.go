package generic

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// Handler answers one call of a unary method served from its descriptor:
// req is a message of the method's input type, and the response must be
// one of its output type.
type Handler func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error)

// Register serves the unary method md on s with h, without generated
// types, under its kernrpc name (md.FullName(), "pkg.Service.Method"), and
// gives md's file to s's reflection service first: a file the server
// refuses (its names declared by another file) leaves the method
// unregistered. Register every method
// before s starts. The server's codec must encode messages through
// protobuf's reflection (protobuf or json).
func Register(s *kernrpc.Server, md protoreflect.MethodDescriptor, h Handler) error {
	if k := KindOf(md); k != Unary {
		return fmt.Errorf("generic: Register %s: it is %s: use RegisterStream", md.FullName(), k)
	}
	// The file first: a method must not be served from a file the
	// server refused.
	if err := s.RegisterFileDescriptor(md.ParentFile()); err != nil {
		return err
	}
	in, out := md.Input(), md.Output()
	name := string(md.FullName())
	return s.Register(name, func() any { return dynamicpb.NewMessage(in) }, func(ctx context.Context, req any) (any, error) {
		resp, err := h(ctx, req.(*dynamicpb.Message))
		if err != nil {
			return nil, err
		}
		if err := checkResponse(name, out, resp); err != nil {
			return nil, err
		}
		return resp, nil
	})
}

// checkResponse refuses a handler's answer of another type than the
// method's, which the client would decode as if it were the right one.
func checkResponse(method string, want protoreflect.MessageDescriptor, resp *dynamicpb.Message) error {
	if resp == nil {
		return kernel.Errorf(kernel.Internal, "the handler of %s returned neither a response nor an error", method)
	}
	if got := resp.Descriptor().FullName(); got != want.FullName() {
		return kernel.Errorf(kernel.Internal, "the handler of %s answered with a %s, want a %s", method, got, want.FullName())
	}
	return nil
}

// ServerStream is a streaming call of a method served from its
// descriptor, as its handler sees it.
type ServerStream struct {
	*kernrpc.ServerStream
	md protoreflect.MethodDescriptor
}

// Method is the descriptor of the stream's method.
func (s *ServerStream) Method() protoreflect.MethodDescriptor { return s.md }

// Recv reads the client's next message; io.EOF once it closed its side.
func (s *ServerStream) Recv() (*dynamicpb.Message, error) {
	m := dynamicpb.NewMessage(s.md.Input())
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// Send sends m, a message of the method's output type, to the client.
func (s *ServerStream) Send(m *dynamicpb.Message) error {
	if err := checkResponse(string(s.md.FullName()), s.md.Output(), m); err != nil {
		return err
	}
	return s.SendMsg(m)
}

// StreamHandler serves one streaming call: it reads with st.Recv, sends
// with st.Send, and its return ends the stream (nil is OK, else a
// *kernel.Status).
type StreamHandler func(ctx context.Context, st *ServerStream) error

// RegisterStream serves the streaming method md (of any streaming kind)
// on s with h, as Register does a unary one. A server-streaming handler
// reads its one request with st.Recv; a client-streaming one sends its
// one response with st.Send.
func RegisterStream(s *kernrpc.Server, md protoreflect.MethodDescriptor, h StreamHandler) error {
	var kind kernel.StreamKind
	switch KindOf(md) {
	case Unary:
		return fmt.Errorf("generic: RegisterStream %s: it is unary: use Register", md.FullName())
	case ClientStreaming:
		kind = kernel.ClientStreaming
	case ServerStreaming:
		kind = kernel.ServerStreaming
	case BidiStreaming:
		kind = kernel.BidiStreaming
	}
	if err := s.RegisterFileDescriptor(md.ParentFile()); err != nil {
		return err
	}
	return s.RegisterStream(string(md.FullName()), kind, func(ctx context.Context, st *kernrpc.ServerStream) error {
		return h(ctx, &ServerStream{ServerStream: st, md: md})
	})
}
