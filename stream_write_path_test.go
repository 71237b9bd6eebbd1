package kernrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// countWrites is tcp-lv whose dialled connections count how the engine
// writes stream messages.
var countWrites = &countWritesTransport{}

func init() {
	registerTCPWrapper("test-count-writes", "test: tcp-lv whose client connections count how stream messages are written", &countWrites.Transport, countWrites)
}

type countWritesTransport struct {
	kernel.Transport
	last atomic.Pointer[countingConn]
}

func (t *countWritesTransport) Dial(ctx context.Context, addr string) (kernel.Conn, error) {
	c, err := t.Transport.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: c}
	t.last.Store(cc)
	return cc, nil
}

// countingConn offers what tcp-lv's connection does, FrameQueuer and
// ContextWriter both, and counts the stream messages given to each way.
type countingConn struct {
	kernel.Conn
	queued, direct atomic.Int64
}

func (c *countingConn) count(f *kernel.Frame, queued bool) {
	if f.Type == kernel.FrameStreamData && len(f.Payload) > 0 { // a message, not the half-close
		if queued {
			c.queued.Add(1)
		} else {
			c.direct.Add(1)
		}
	}
}

func (c *countingConn) WriteFrame(f *kernel.Frame) error {
	c.count(f, false)
	return c.Conn.WriteFrame(f)
}

func (c *countingConn) QueueFrame(f *kernel.Frame) error {
	c.count(f, true)
	return c.Conn.(kernel.FrameQueuer).QueueFrame(f)
}

func (c *countingConn) WriteFrameContext(ctx context.Context, f *kernel.Frame) error {
	c.count(f, false)
	return c.Conn.(kernel.ContextWriter).WriteFrameContext(ctx, f)
}

// A stream's messages go to a transport that queues frames
// (kernel.FrameQueuer: tcp-lv) queued, whether or not it also bounds a
// write's wait by a context (kernel.ContextWriter), so that messages sent
// back to back share a write: written one by one, a stream of 16 B
// messages over tcp-lv went 20 times slower.
func TestStreamMessagesAreQueuedWhereTheTransportQueues(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-count-writes", nil
	startServer(t, cfg, streamHandlers)
	cli := newClient(t, cfg)
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Join")
	if err != nil {
		t.Fatal(err)
	}
	const messages = 50
	for range messages {
		if err := st.Send(&echopb.Echo{Text: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	c := countWrites.last.Load()
	if q, d := c.queued.Load(), c.direct.Load(); q < messages || d != 0 {
		t.Fatalf("of %d stream messages, %d were queued and %d written directly; want every one queued, to share writes", messages, q, d)
	}
}
