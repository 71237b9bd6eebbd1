package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc/internal/plainpb"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/shmring"
)

// Floors (-floors): what this machine allows without any framework,
// measured in the same run as the frameworks, since the machine's own
// speed moves from run to run. Each caller has a connection of its own and
// does a plain ping-pong on it, reusing its buffers, and reads the answer
// into a buffer of its own, as a caller of an echo service does.
//
//   - bare-tcp: a 4-byte length and the payload over loopback TCP.
//   - bare-tcp-pb: the same, with the payload in a plainpb.Echo that each
//     side encodes with protobuf-go into a reused buffer and decodes into a
//     new message, as a framework must for a user's plain protoc-gen-go
//     messages: the floor under kernrpc's default path.
//   - bare-shm (Linux): the shm-ring transport's frames, written into the
//     ring and read from it, without the kernel, a codec or call matching.
//   - bare-shm-pb (Linux): the same, with protobuf-go messages as in
//     bare-tcp-pb: the floor under kernrpc/shm-ring's default path.

// floorSystems are the systems -floors adds.
var floorSystems = []string{"bare-tcp", "bare-tcp-pb", "bare-shm", "bare-shm-pb"}

func init() {
	registerSystem(&system{name: "bare-tcp", label: "bare TCP", serve: serveBareTCP, dial: dialBareTCP})
	registerSystem(&system{name: "bare-tcp-pb", label: "bare TCP + protobuf", serve: serveBareTCPProto, dial: dialBareTCPProto, streams: true})
	registerSystem(&system{name: "bare-shm", label: "bare shm-ring", serve: serveBareShm, dial: dialBareShm})
	registerSystem(&system{name: "bare-shm-pb", label: "bare shm-ring + protobuf", serve: serveBareShmProto, dial: dialBareShmProto})
	if runtime.GOOS != "linux" {
		floorSystems = floorSystems[:2] // the TCP ones
	}
}

// maxBareFrame bounds what the bare TCP server allocates for a length it
// reads: the harness sends at most a few MiB.
const maxBareFrame = 64 << 20

func serveBareTCP(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	return listenBareTCP(ctx, addr, echoBareTCP)
}

func serveBareTCPProto(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	return listenBareTCP(ctx, addr, echoBareTCPProto)
}

// listenBareTCP serves every connection accepted on addr with echo, on a
// goroutine of its own.
func listenBareTCP(ctx context.Context, addr string, echo func(net.Conn)) (string, func(context.Context) error, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("bare tcp: listen %s: %w", addr, err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go echo(conn)
		}
	}()
	return ln.Addr().String(), func(context.Context) error { return ln.Close() }, nil
}

// echoBareTCP answers every length-prefixed message on conn with itself,
// until the peer hangs up.
func echoBareTCP(conn net.Conn) {
	defer conn.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := readBareMessage(conn, &buf)
		if err != nil {
			return
		}
		if _, err := conn.Write(buf[:4+n]); err != nil {
			return
		}
	}
}

// echoBareTCPProto answers every length-prefixed plainpb.Echo on conn
// with the message it decodes, encoded again, until the peer hangs up; a
// message with a text asks for a stream (floors_stream.go).
func echoBareTCPProto(conn net.Conn) {
	defer conn.Close()
	in, out := make([]byte, 64<<10), make([]byte, 0, 64<<10)
	for {
		n, err := readBareMessage(conn, &in)
		if err != nil {
			return
		}
		req := new(plainpb.Echo)
		if err := proto.Unmarshal(in[4:4+n], req); err != nil {
			return
		}
		if req.Text != "" {
			if out, err = sendBareStream(conn, req, out); err != nil {
				return
			}
			continue
		}
		if out, err = appendBareProto(out[:0], req); err != nil {
			return
		}
		if _, err := conn.Write(out); err != nil {
			return
		}
	}
}

// appendBareProto appends m to dst behind a 4-byte length.
func appendBareProto(dst []byte, m proto.Message) ([]byte, error) {
	dst, err := proto.MarshalOptions{}.MarshalAppend(append(dst, 0, 0, 0, 0), m)
	if err != nil {
		return dst, fmt.Errorf("bare tcp: encode: %w", err)
	}
	binary.BigEndian.PutUint32(dst, uint32(len(dst)-4))
	return dst, nil
}

// readBareMessage reads one length-prefixed message into *buf, growing it
// as needed, and returns the payload's length. A ping-pong has nothing
// behind the message, so one read usually takes all of it.
func readBareMessage(conn net.Conn, buf *[]byte) (int, error) {
	got, err := io.ReadAtLeast(conn, *buf, 4)
	if err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint32((*buf)[:4]))
	if n > maxBareFrame {
		return 0, fmt.Errorf("bare tcp: message of %d bytes", n)
	}
	if len(*buf) < 4+n {
		*buf = append(*buf, make([]byte, 4+n-len(*buf))...)
	}
	if got < 4+n {
		_, err = io.ReadFull(conn, (*buf)[got:4+n])
	}
	return n, err
}

func dialBareTCP(_ context.Context, addr string) (echoClient, error) {
	return &bareClient{addr: addr, dial: func(ctx context.Context, addr string) (io.Closer, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, call: bareTCPCall}, nil
}

// bareTCPCall returns one caller's ping-pong on its connection.
func bareTCPCall(c io.Closer, payload []byte) callFunc {
	conn := c.(net.Conn)
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(payload)), uint32(len(payload)))
	out = append(out, payload...)
	in := make([]byte, 4+len(payload))
	return func(context.Context) (int, error) {
		if _, err := conn.Write(out); err != nil {
			return 0, err
		}
		return readBareMessage(conn, &in)
	}
}

func dialBareTCPProto(_ context.Context, addr string) (echoClient, error) {
	return bareProtoClient{&bareClient{addr: addr, dial: func(ctx context.Context, addr string) (io.Closer, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, call: bareTCPProtoCall}}, nil
}

// bareTCPProtoCall returns one caller's ping-pong on its connection, with
// the request encoded on every call and each answer decoded into a new
// message, as a framework's caller gets it.
func bareTCPProtoCall(c io.Closer, payload []byte) callFunc {
	conn := c.(net.Conn)
	req := &plainpb.Echo{Payload: payload}
	out, in := make([]byte, 0, 4+len(payload)+16), make([]byte, 4+len(payload)+16)
	return func(context.Context) (int, error) {
		var err error
		if out, err = appendBareProto(out[:0], req); err != nil {
			return 0, err
		}
		if _, err := conn.Write(out); err != nil {
			return 0, err
		}
		n, err := readBareMessage(conn, &in)
		if err != nil {
			return 0, err
		}
		resp := new(plainpb.Echo)
		if err := proto.Unmarshal(in[4:4+n], resp); err != nil {
			return 0, fmt.Errorf("bare tcp: decode: %w", err)
		}
		return len(resp.Payload), nil
	}
}

func serveBareShm(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	return listenBareShm(ctx, addr, echoBareShm)
}

func serveBareShmProto(ctx context.Context, addr string, _ serveOptions) (string, func(context.Context) error, error) {
	return listenBareShm(ctx, addr, echoBareShmProto)
}

// listenBareShm serves every client attached on addr with echo, on a
// goroutine of its own.
func listenBareShm(ctx context.Context, addr string, echo func(kernel.Conn)) (string, func(context.Context) error, error) {
	tr, err := shmring.New(shmring.DefaultOptions())
	if err != nil {
		return "", nil, fmt.Errorf("bare shm-ring: %w", err)
	}
	ln, err := tr.Listen(ctx, addr)
	if err != nil {
		return "", nil, fmt.Errorf("bare shm-ring: listen %s: %w", addr, err)
	}
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go echo(conn)
		}
	}()
	return ln.Addr(), func(context.Context) error { return ln.Close() }, nil
}

// echoBareShm answers every frame on conn with a frame carrying a copy of
// its payload, written into the ring as the kernel's server does.
func echoBareShm(conn kernel.Conn) {
	defer conn.Close()
	for {
		f, err := conn.ReadFrame(context.Background())
		if err != nil {
			return
		}
		back := *f
		back.Payload = append(conn.Buffer(len(f.Payload)), f.Payload...)
		f.Release()
		if conn.WriteFrame(&back) != nil {
			return
		}
	}
}

// echoBareShmProto answers every frame on conn with the plainpb.Echo it
// decodes from the frame, encoded again into the ring.
func echoBareShmProto(conn kernel.Conn) {
	defer conn.Close()
	for {
		f, err := conn.ReadFrame(context.Background())
		if err != nil {
			return
		}
		req := new(plainpb.Echo)
		err = proto.Unmarshal(f.Payload, req)
		back := *f
		f.Release()
		if err != nil {
			return
		}
		if back.Payload, err = encodeIntoRing(conn, req); err != nil || conn.WriteFrame(&back) != nil {
			return
		}
	}
}

// encodeIntoRing encodes m into a buffer conn lends for its next frame.
func encodeIntoRing(conn kernel.Conn, m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{}.MarshalAppend(conn.Buffer(proto.Size(m)), m)
	if err != nil {
		return nil, fmt.Errorf("bare shm-ring: encode: %w", err)
	}
	return b, nil
}

func dialBareShm(_ context.Context, addr string) (echoClient, error) {
	return dialShm(addr, bareShmCall)
}

func dialBareShmProto(_ context.Context, addr string) (echoClient, error) {
	return dialShm(addr, bareShmProtoCall)
}

// dialShm makes a bare client whose callers each attach to addr and call
// it with call.
func dialShm(addr string, call func(io.Closer, []byte) callFunc) (echoClient, error) {
	tr, err := shmring.New(shmring.DefaultOptions())
	if err != nil {
		return nil, fmt.Errorf("bare shm-ring: %w", err)
	}
	return &bareClient{addr: addr, dial: func(ctx context.Context, addr string) (io.Closer, error) {
		return tr.Dial(ctx, addr)
	}, call: call}, nil
}

// bareShmProtoCall returns one caller's ping-pong on its attached client,
// with the request encoded on every call and each answer decoded into a
// new message.
func bareShmProtoCall(c io.Closer, payload []byte) callFunc {
	conn := c.(kernel.Conn)
	f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: "Echo.Echo"}
	req := &plainpb.Echo{Payload: payload}
	return func(ctx context.Context) (int, error) {
		var err error
		f.CallID++
		if f.Payload, err = encodeIntoRing(conn, req); err != nil {
			return 0, err
		}
		if err := conn.WriteFrame(f); err != nil {
			return 0, err
		}
		r, err := conn.ReadFrame(ctx)
		if err != nil {
			return 0, err
		}
		resp := new(plainpb.Echo)
		err = proto.Unmarshal(r.Payload, resp)
		id := r.CallID
		r.Release()
		switch {
		case err != nil:
			return 0, fmt.Errorf("bare shm-ring: decode: %w", err)
		case id != f.CallID:
			return 0, fmt.Errorf("bare shm-ring: frame %d answered message %d", id, f.CallID)
		}
		return len(resp.Payload), nil
	}
}

// bareShmCall returns one caller's ping-pong on its attached client.
func bareShmCall(c io.Closer, payload []byte) callFunc {
	conn := c.(kernel.Conn)
	f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, Method: "Echo.Echo"}
	in := make([]byte, len(payload))
	return func(ctx context.Context) (int, error) {
		f.CallID++
		f.Payload = append(conn.Buffer(len(payload)), payload...)
		if err := conn.WriteFrame(f); err != nil {
			return 0, err
		}
		r, err := conn.ReadFrame(ctx)
		if err != nil {
			return 0, err
		}
		n := copy(in, r.Payload)
		id, got := r.CallID, len(r.Payload)
		r.Release()
		if id != f.CallID || n != got {
			return 0, fmt.Errorf("bare shm-ring: frame %d of %d bytes answered message %d", id, got, f.CallID)
		}
		return n, nil
	}
}

// bareClient gives each caller a connection of its own: a bare ping-pong
// cannot share one.
type bareClient struct {
	addr string
	dial func(ctx context.Context, addr string) (io.Closer, error)
	call func(conn io.Closer, payload []byte) callFunc

	mu    sync.Mutex
	conns []io.Closer
}

func (c *bareClient) newCaller(payload []byte) callFunc {
	conn, err := c.dial(context.Background(), c.addr)
	if err != nil {
		return func(context.Context) (int, error) { return 0, fmt.Errorf("dial %s: %w", c.addr, err) }
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return c.call(conn, payload)
}

func (c *bareClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, conn := range c.conns {
		errs = append(errs, conn.Close())
	}
	c.conns = nil
	return errors.Join(errs...)
}
