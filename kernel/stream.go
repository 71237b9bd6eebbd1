package kernel

import (
	"context"
	"strconv"
)

// StreamKind says which sides of a streaming call send more than one
// message. It matters to code generators and reflection; on the wire
// every stream is bidirectional (docs/protocol.md, "Streams").
type StreamKind uint8

const (
	// ClientStreaming: the client sends many messages, the server answers
	// with one.
	ClientStreaming StreamKind = 1
	// ServerStreaming: the client sends one message, the server many.
	ServerStreaming StreamKind = 2
	// BidiStreaming: both sides send many, independently.
	BidiStreaming StreamKind = 3
)

func (k StreamKind) String() string {
	switch k {
	case ClientStreaming:
		return "client-streaming"
	case ServerStreaming:
		return "server-streaming"
	case BidiStreaming:
		return "bidi-streaming"
	}
	return "StreamKind(" + strconv.Itoa(int(k)) + ")"
}

// Stream is one streaming call as a stream filter sees it: the messages
// its side sends and receives, in order. SendMsg encodes m with the
// call's codec and blocks while the peer has granted no credit (honouring
// the call's context); RecvMsg decodes the next message into m and
// returns io.EOF once the peer has sent its last one. A filter may wrap a
// Stream to watch or change the messages, and pass the wrapper on.
type Stream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// StreamInvoker is what a stream filter calls to pass a stream on: the
// next filter, or at the end of the chain the handler (server) or the
// caller's use of the stream (client). It returns once the stream has
// ended, with its final status: nil for OK, else a *Status.
type StreamInvoker func(ctx context.Context, info *CallInfo, st Stream) error

// StreamFilter is an optional Filter interface: a filter that also
// applies to streaming calls (tracing, metrics, auth, logging). Filters
// without it are not applied to streams at all (retry and hedge, whose
// Invoke resends a request, have no meaning there).
//
// InvokeStream runs for the whole life of one stream, on both sides:
//   - on the server, next runs the handler and returns when it does;
//   - on the client, next opens the stream (the request metadata in info
//     goes out with it), hands it to the caller, and returns when the
//     stream has ended, with info.ResponseMetadata holding the trailers.
//
// A filter may refuse the stream by returning a *Status without calling
// next, derive the context it passes on, and wrap st. It must call next
// at most once, and must not keep info or st after it returns.
type StreamFilter interface {
	InvokeStream(ctx context.Context, info *CallInfo, st Stream, next StreamInvoker) error
}

// StreamFrameOverhead is what every StreamData frame that carries a
// message costs in flow-control credit besides its payload, so that a
// flood of empty messages still spends the receiver's window.
const StreamFrameOverhead = FrameFixedLen

// StreamCost is the credit a StreamData frame with a payload of n bytes
// costs its sender (docs/protocol.md, "Flow control").
func StreamCost(n int) int64 { return int64(n) + StreamFrameOverhead }
