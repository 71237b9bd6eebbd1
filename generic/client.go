package generic

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
)

// Client calls any method by name, with requests and responses built from
// the method's descriptor, which it finds in its Source. The kernrpc
// client it calls through must use a codec that encodes messages through
// protobuf's reflection (protobuf or json): msgpack and flatbuffers need
// generated types.
type Client struct {
	c   *kernrpc.Client
	src Source
}

// NewClient calls through c, finding descriptors in src.
func NewClient(c *kernrpc.Client, src Source) *Client { return &Client{c: c, src: src} }

// Source is where the client finds descriptors.
func (g *Client) Source() Source { return g.src }

// Method finds the descriptor of method ("pkg.Service.Method"); see
// FindMethod for its errors.
func (g *Client) Method(ctx context.Context, method string) (protoreflect.MethodDescriptor, error) {
	return FindMethod(ctx, g.src, method)
}

// Call calls a unary method with req, a message of its input type (a
// *dynamicpb.Message or a generated message), and returns the response.
// A status the server answers with is returned as is (kernel.CodeOf
// reads its code).
func (g *Client) Call(ctx context.Context, method string, req proto.Message, opts ...kernrpc.CallOption) (*dynamicpb.Message, error) {
	md, err := g.Method(ctx, method)
	if err != nil {
		return nil, err
	}
	return g.CallMethod(ctx, md, req, opts...)
}

// CallMethod is Call with the descriptor already found.
func (g *Client) CallMethod(ctx context.Context, md protoreflect.MethodDescriptor, req proto.Message, opts ...kernrpc.CallOption) (*dynamicpb.Message, error) {
	if k := KindOf(md); k != Unary {
		return nil, fmt.Errorf("generic: %s is %s: open it with OpenStream (or ServerStream)", md.FullName(), k)
	}
	if err := checkType(md, "request", md.Input(), req); err != nil {
		return nil, err
	}
	resp := dynamicpb.NewMessage(md.Output())
	if err := g.c.Call(ctx, string(md.FullName()), req, resp, opts...); err != nil {
		return nil, err
	}
	return resp, nil
}

// CallJSON calls a unary method with the request in its JSON form (see
// UnmarshalJSON) and returns the response's (see MarshalJSON). A request
// that does not fit the input message fails before anything is sent, with
// an error wrapping ErrBadJSON that names the field.
func (g *Client) CallJSON(ctx context.Context, method string, reqJSON []byte, opts ...kernrpc.CallOption) ([]byte, error) {
	md, err := g.Method(ctx, method)
	if err != nil {
		return nil, err
	}
	req, err := g.requestFromJSON(ctx, md, reqJSON)
	if err != nil {
		return nil, err
	}
	resp, err := g.CallMethod(ctx, md, req, opts...)
	if err != nil {
		return nil, err
	}
	return g.EncodeJSON(ctx, resp)
}

// DecodeJSON is the package's UnmarshalJSON, with the type a
// google.protobuf.Any names looked up in the client's Source too (asking
// it with ctx).
func (g *Client) DecodeJSON(ctx context.Context, desc protoreflect.MessageDescriptor, data []byte) (*dynamicpb.Message, error) {
	return unmarshalJSON(sourceTypes{ctx, g.src}, desc, data)
}

// EncodeJSON is the package's MarshalJSON, with the type a
// google.protobuf.Any names looked up in the client's Source too (asking
// it with ctx).
func (g *Client) EncodeJSON(ctx context.Context, m proto.Message) ([]byte, error) {
	return marshalJSON(sourceTypes{ctx, g.src}, m)
}

func (g *Client) requestFromJSON(ctx context.Context, md protoreflect.MethodDescriptor, reqJSON []byte) (*dynamicpb.Message, error) {
	req, err := g.DecodeJSON(ctx, md.Input(), reqJSON)
	if err != nil {
		return nil, fmt.Errorf("generic: request of %s: %w", md.FullName(), err)
	}
	return req, nil
}

// checkType refuses a message of another type than the method's: the
// codec would encode it without complaint, and the server would decode
// its fields as if they were the right ones.
func checkType(md protoreflect.MethodDescriptor, what string, want protoreflect.MessageDescriptor, m proto.Message) error {
	if isNil(m) {
		return fmt.Errorf("generic: %s of %s: nil message", what, md.FullName())
	}
	if got := m.ProtoReflect().Descriptor().FullName(); got != want.FullName() {
		return fmt.Errorf("generic: %s of %s: a %s, want a %s", what, md.FullName(), got, want.FullName())
	}
	return nil
}

// isNil reports whether m is nil or a nil *dynamicpb.Message, which has
// no descriptor to compare: asking it for one (or whether it is valid)
// panics. A nil generated message knows its type, and goes as an empty
// one, as protobuf encodes it.
func isNil(m proto.Message) bool {
	dm, ok := m.(*dynamicpb.Message)
	return m == nil || ok && dm == nil
}

// ClientStream is a streaming call opened generically.
type ClientStream struct {
	*kernrpc.ClientStream
	md protoreflect.MethodDescriptor
}

// OpenStream opens a streaming call of method, of any streaming kind: a
// server-streaming one takes one Send, then CloseSend.
func (g *Client) OpenStream(ctx context.Context, method string, opts ...kernrpc.CallOption) (*ClientStream, error) {
	md, err := g.Method(ctx, method)
	if err != nil {
		return nil, err
	}
	if KindOf(md) == Unary {
		return nil, fmt.Errorf("generic: %s is unary: call it with Call", md.FullName())
	}
	cs, err := g.c.NewStream(ctx, string(md.FullName()), opts...)
	if err != nil {
		return nil, err
	}
	return &ClientStream{ClientStream: cs, md: md}, nil
}

// Method is the descriptor of the stream's method.
func (s *ClientStream) Method() protoreflect.MethodDescriptor { return s.md }

// Send sends m, a message of the method's input type.
func (s *ClientStream) Send(m proto.Message) error {
	if err := checkType(s.md, "message", s.md.Input(), m); err != nil {
		return err
	}
	return s.SendMsg(m)
}

// Recv reads the server's next message; io.EOF at the end of a stream
// the server ended with OK, else its status.
func (s *ClientStream) Recv() (*dynamicpb.Message, error) {
	m := dynamicpb.NewMessage(s.md.Output())
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// ServerStream calls a server-streaming method with req and hands each
// message the server sends to fn, until the server ends the stream (nil
// for OK, else its status) or fn returns an error, which abandons the
// stream and is returned.
func (g *Client) ServerStream(ctx context.Context, method string, req proto.Message, fn func(*dynamicpb.Message) error, opts ...kernrpc.CallOption) error {
	md, err := g.Method(ctx, method)
	if err != nil {
		return err
	}
	return g.serverStream(ctx, md, req, fn, opts)
}

func (g *Client) serverStream(ctx context.Context, md protoreflect.MethodDescriptor, req proto.Message, fn func(*dynamicpb.Message) error, opts []kernrpc.CallOption) error {
	if k := KindOf(md); k != ServerStreaming {
		return fmt.Errorf("generic: %s is %s, not server-streaming", md.FullName(), k)
	}
	if err := checkType(md, "request", md.Input(), req); err != nil {
		return err
	}
	cs, err := g.c.NewStream(ctx, string(md.FullName()), opts...)
	if err != nil {
		return err
	}
	defer cs.Close()
	st := &ClientStream{ClientStream: cs, md: md}
	if err := cs.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}

// ServerStreamJSON is ServerStream with the request and each message in
// their JSON forms.
func (g *Client) ServerStreamJSON(ctx context.Context, method string, reqJSON []byte, fn func([]byte) error, opts ...kernrpc.CallOption) error {
	md, err := g.Method(ctx, method)
	if err != nil {
		return err
	}
	req, err := g.requestFromJSON(ctx, md, reqJSON)
	if err != nil {
		return err
	}
	return g.serverStream(ctx, md, req, func(m *dynamicpb.Message) error {
		b, err := g.EncodeJSON(ctx, m)
		if err != nil {
			// The client's own failure, as CallJSON returns it: a status
			// would read as the server's answer.
			return err
		}
		return fn(b)
	}, opts)
}
