package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/plainpb"
)

// The protobuf floor streams too: a stream is a connection of its own on
// which the server writes length-prefixed messages as fast as the socket
// takes them, with no flow control but TCP's, and the client decodes each
// into a new plainpb.Echo where it lies in the read buffer. It bounds what
// a server stream of plain protoc-gen-go messages can do over one
// loopback connection.

// endOfBareStream is the length that ends a counted bare stream.
const endOfBareStream = 1<<32 - 1

// bareStreamBatch is what the server gathers before a write: small
// messages go out many to a syscall, as a framework's writer batches them;
// a 64 KiB one goes out on its own.
const bareStreamBatch = 64 << 10

// bareStreamBuffer is the client's read buffer: it holds the largest
// message the harness streams, so that each one decodes where it lies.
const bareStreamBuffer = 4 + maxPayload + 64

// sendBareStream answers the stream request req on conn: count messages
// (0: until the client hangs up) of the size it names, then, if counted,
// the end marker.
func sendBareStream(conn net.Conn, req *plainpb.Echo, out []byte) ([]byte, error) {
	size, count, err := parseStreamText(req.Text)
	if err != nil {
		// Streamed messages carry only a payload: one with a text is the
		// server's refusal.
		if refusal, werr := appendBareProto(out[:0], &plainpb.Echo{Text: err.Error()}); werr == nil {
			_, _ = conn.Write(refusal)
		}
		return out, err
	}
	msg := &plainpb.Echo{Payload: make([]byte, size)}
	w := bufio.NewWriterSize(conn, bareStreamBatch)
	err = sendStream(count, func() error {
		var err error
		if out, err = appendBareProto(out[:0], msg); err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	})
	if err != nil {
		return out, err
	}
	if _, err = w.Write(binary.BigEndian.AppendUint32(out[:0], endOfBareStream)); err != nil {
		return out, err
	}
	return out, w.Flush()
}

// bareProtoClient is bare-tcp-pb's client: a bare client that also opens
// streams, each on a connection of its own.
type bareProtoClient struct{ *bareClient }

func (c bareProtoClient) openStream(ctx context.Context, size, count int) (msgStream, error) {
	nc, err := c.dial(ctx, c.addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.addr, err)
	}
	conn := nc.(net.Conn)
	req, err := appendBareProto(nil, &plainpb.Echo{Text: streamText(size, count)})
	if err == nil {
		_, err = conn.Write(req)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("bare tcp: open a stream: %w", err)
	}
	// The stream lives as long as ctx, as a framework's does: a reader
	// waiting on it then fails rather than hangs.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return &bareStream{conn: conn, r: bufio.NewReaderSize(conn, bareStreamBuffer), stop: stop}, nil
}

// bareStream reads one bare stream.
type bareStream struct {
	conn net.Conn
	r    *bufio.Reader
	stop func() bool
	head [4]byte
}

func (s *bareStream) recv() (int, error) {
	if _, err := io.ReadFull(s.r, s.head[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(s.head[:])
	if n == endOfBareStream {
		return 0, io.EOF
	}
	if n > bareStreamBuffer {
		return 0, fmt.Errorf("bare tcp: streamed message of %d bytes", n)
	}
	b, err := s.r.Peek(int(n))
	if err != nil {
		return 0, err
	}
	msg := new(plainpb.Echo)
	if err := proto.Unmarshal(b, msg); err != nil {
		return 0, fmt.Errorf("bare tcp: decode: %w", err)
	}
	if msg.Text != "" {
		return 0, fmt.Errorf("bare tcp: the server refused the stream: %s", msg.Text)
	}
	_, err = s.r.Discard(int(n))
	return len(msg.Payload), err
}

func (s *bareStream) Close() error {
	s.stop()
	return s.conn.Close()
}
