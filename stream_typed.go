package kernrpc

import (
	"context"
	"errors"
	"io"

	"github.com/kernrpc/kernrpc/kernel"
)

// ServerStreamOf is a ServerStream with typed messages: Req the client
// sends, Resp the server sends.
type ServerStreamOf[Req, Resp any] struct {
	*ServerStream
}

// Recv reads the client's next message; io.EOF once it closed its side.
func (s ServerStreamOf[Req, Resp]) Recv() (*Req, error) {
	m := new(Req)
	if err := s.recvNew(m); err != nil {
		return nil, err
	}
	return m, nil
}

// Send sends m to the client, waiting for credit while it reads slowly.
func (s ServerStreamOf[Req, Resp]) Send(m *Resp) error { return s.SendMsg(m) }

// HandleBidiStream registers a handler for a bidirectional streaming
// method: both sides send as many messages as they like. The handler's
// return ends the stream: nil is status OK, else a *kernel.Status (any
// other error is Unknown).
// Like Handle, it panics on a misuse RegisterStream would return.
func HandleBidiStream[Req, Resp any](s *Server, method string, h func(ctx context.Context, st ServerStreamOf[Req, Resp]) error) {
	mustRegister(s.RegisterStream(method, kernel.BidiStreaming, func(ctx context.Context, st *ServerStream) error {
		return h(ctx, ServerStreamOf[Req, Resp]{st})
	}))
}

// HandleServerStream registers a handler for a server-streaming method:
// the client sends one request, the handler sends any number of messages
// through st and returns to end the stream.
// Like Handle, it panics on a misuse RegisterStream would return.
func HandleServerStream[Req, Resp any](s *Server, method string, h func(ctx context.Context, req *Req, st ServerStreamOf[Req, Resp]) error) {
	mustRegister(s.RegisterStream(method, kernel.ServerStreaming, func(ctx context.Context, st *ServerStream) error {
		typed := ServerStreamOf[Req, Resp]{st}
		req, err := typed.Recv()
		if errors.Is(err, io.EOF) {
			return kernel.Errorf(kernel.InvalidArgument, "%s is server-streaming: send one request before closing your side", st.Info().Method)
		}
		if err != nil {
			return err
		}
		return h(ctx, req, typed)
	}))
}

// HandleClientStream registers a handler for a client-streaming method:
// the client sends any number of messages, the handler reads them with
// st.Recv (io.EOF at the end) and returns the one response.
// Like Handle, it panics on a misuse RegisterStream would return.
func HandleClientStream[Req, Resp any](s *Server, method string, h func(ctx context.Context, st ServerStreamOf[Req, Resp]) (*Resp, error)) {
	mustRegister(s.RegisterStream(method, kernel.ClientStreaming, func(ctx context.Context, st *ServerStream) error {
		resp, err := h(ctx, ServerStreamOf[Req, Resp]{st})
		if err != nil {
			return err
		}
		if resp == nil {
			return kernel.Errorf(kernel.Internal, "the handler of %s returned neither a response nor an error", st.Info().Method)
		}
		return st.SendMsg(resp)
	}))
}

func mustRegister(err error) {
	if err != nil {
		panic(err)
	}
}

// ClientStreamOf is a ClientStream with typed messages: Req the client
// sends, Resp the server sends.
type ClientStreamOf[Req, Resp any] struct {
	*ClientStream
}

// OpenStream opens a bidirectional or client-streaming call of method.
func OpenStream[Req, Resp any](ctx context.Context, c *Client, method string, opts ...CallOption) (ClientStreamOf[Req, Resp], error) {
	cs, err := c.NewStream(ctx, method, opts...)
	return ClientStreamOf[Req, Resp]{cs}, err
}

// OpenServerStream opens a server-streaming call of method with its one
// request: read the answers with Recv until io.EOF.
func OpenServerStream[Req, Resp any](ctx context.Context, c *Client, method string, req *Req, opts ...CallOption) (ClientStreamOf[Req, Resp], error) {
	cs, err := c.NewStream(ctx, method, opts...)
	if err != nil {
		return ClientStreamOf[Req, Resp]{}, err
	}
	if err := cs.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		cs.Close()
		return ClientStreamOf[Req, Resp]{}, err
	}
	if err := cs.CloseSend(); err != nil {
		cs.Close()
		return ClientStreamOf[Req, Resp]{}, err
	}
	return ClientStreamOf[Req, Resp]{cs}, nil
}

// Send sends m to the server, waiting for credit while it reads slowly.
func (s ClientStreamOf[Req, Resp]) Send(m *Req) error { return s.SendMsg(m) }

// Recv reads the server's next message. At the end it returns io.EOF if
// the server ended the stream with OK, else its status.
func (s ClientStreamOf[Req, Resp]) Recv() (*Resp, error) {
	m := new(Resp)
	if err := s.recvNew(m); err != nil {
		return nil, err
	}
	return m, nil
}

// CloseAndRecv ends a client-streaming call: it closes this side and
// returns the server's one response. Call it once: a second call returns
// FailedPrecondition.
func (s ClientStreamOf[Req, Resp]) CloseAndRecv() (*Resp, error) {
	if s.answered.Swap(true) {
		return nil, kernel.Errorf(kernel.FailedPrecondition, "CloseAndRecv called twice on the client-streaming call of %s: the first returned its outcome, the response or the error", s.Info().Method)
	}
	if err := s.CloseSend(); err != nil {
		// The connection is lost: no Recv will return the end that would
		// free the stream, so it is freed here, ended with that loss (a
		// Close would end it Canceled, if it came before the reader
		// recorded the loss, and the filters would see that instead).
		s.endWith(err)
		return nil, err
	}
	resp, err := s.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = kernel.Errorf(kernel.Internal, "the server ended the client-streaming call of %s with OK but no response", s.Info().Method)
		}
		return nil, err
	}
	// Read the end, so that the stream frees itself.
	if extra := s.RecvMsg(new(Resp)); extra == nil {
		s.Close()
		return nil, kernel.Errorf(kernel.Internal, "the server sent more than one response to the client-streaming call of %s", s.Info().Method)
	} else if !errors.Is(extra, io.EOF) {
		return nil, extra
	}
	return resp, nil
}
