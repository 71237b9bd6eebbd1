package kernrpc_test

import (
	"context"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// floodHandlers registers Flood.Out, which sends 64 KiB messages until
// its context ends, counting them in sent.
func floodHandlers(sent *atomic.Int64, size int) func(*kernrpc.Server) {
	return func(srv *kernrpc.Server) {
		kernrpc.HandleServerStream(srv, "Flood.Out", func(ctx context.Context, _ *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			m := &echopb.Echo{Payload: make([]byte, size)}
			for {
				if err := st.Send(m); err != nil {
					return err
				}
				sent.Add(1)
			}
		})
		kernrpc.HandleClientStream(srv, "Flood.In", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
			<-ctx.Done() // never reads
			return nil, ctx.Err()
		})
	}
}

// settled waits until n stops changing for a while and returns it.
func settled(n *atomic.Int64) int64 {
	last := int64(-1)
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		if v := n.Load(); v == last && v > 0 {
			return v
		} else {
			last = v
		}
	}
	return last
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A client that stops reading a server stream stops the server's handler
// in Send once the window is spent: what it holds meanwhile is bounded by
// the window, however long the server would go on.
func TestStreamReceiverStopsReading(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		const size = 64 << 10
		// The heap is measured: no GC headroom, which the first 64 KiB
		// frame would otherwise add to it.
		none := kernel.Size(0)
		cfg.GCHeadroom = &none
		var sent atomic.Int64
		startServer(t, cfg, floodHandlers(&sent, size))
		cli := newClient(t, cfg)
		before := heapInUse()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Out", &echopb.Echo{})
		if err != nil {
			t.Fatal(err)
		}
		n := settled(&sent)
		grew := int64(heapInUse()) - int64(before)
		window := int64(cfg.Streams.Window)
		// The sender may go past half the window by one message.
		if limit := (window + 2*kernel.StreamCost(size)) / kernel.StreamCost(size); n > limit {
			t.Fatalf("server sent %d messages of 64 KiB to a client that reads none; the %d-byte window allows %d", n, window, limit)
		}
		t.Logf("receiver not reading: sender stopped after %d messages (%d KiB); the heap grew by %d KiB", n, n*size>>10, grew>>10)
		// Both sides are in this process, and a 64 KiB frame sits in a
		// 128 KiB pooled buffer: four windows and a little is the bound;
		// a sender that did not wait would have sent hundreds of MiB.
		if limit := 4*window + 1<<20; grew > limit {
			t.Errorf("heap grew by %d KiB while the stream was stalled; want it within %d KiB (the %d KiB window)", grew>>10, limit>>10, window>>10)
		}
		// Reading resumes the flow.
		for i := range n + 10 {
			if _, err := st.Recv(); err != nil {
				t.Fatalf("message %d after resuming: %v", i, err)
			}
		}
	})
}

// A server that stops reading a client stream stops the client in Send,
// which honours the stream's context.
func TestStreamSenderBlocksOnSlowServer(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		var unused atomic.Int64
		startServer(t, cfg, floodHandlers(&unused, 0))
		cli := newClient(t, cfg)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.In")
		if err != nil {
			t.Fatal(err)
		}
		var sent atomic.Int64
		done := make(chan error, 1)
		go func() {
			m := &echopb.Echo{Payload: make([]byte, 32<<10)}
			for {
				if err := st.Send(m); err != nil {
					done <- err
					return
				}
				sent.Add(1)
			}
		}()
		n := settled(&sent)
		if max := int64(cfg.Streams.Window)/(32<<10) + 2; n > max {
			t.Fatalf("client sent %d messages of 32 KiB to a server that reads none; the window allows %d", n, max)
		}
		cancel()
		if err := receive(t, done, 2*time.Second, "Send still blocked after the stream's context was cancelled"); kernel.CodeOf(err) != kernel.Canceled {
			t.Fatalf("blocked Send ended with %v, want Canceled", err)
		}
	})
}

// Many stalled streams together hold no more than the connection window.
func TestStreamConnectionWindowBoundsAllStreams(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		const size = 16 << 10
		cfg.Streams.Window, cfg.Streams.ConnectionWindow = 64<<10, 512<<10
		var sent atomic.Int64
		startServer(t, cfg, floodHandlers(&sent, size))
		cli := newClient(t, cfg)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for i := range 64 {
			if _, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Out", &echopb.Echo{}); err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
		}
		n := settled(&sent)
		held := n * kernel.StreamCost(size)
		// 64 streams of 64 KiB windows would allow 4 MiB; the connection's
		// 512 KiB (plus one message past half of it) is the bound.
		if limit := int64(cfg.Streams.ConnectionWindow) + kernel.StreamCost(size); held > limit {
			t.Fatalf("64 stalled streams hold %d bytes; the connection window allows %d", held, limit)
		}
		t.Logf("64 stalled streams: %d messages, %d KiB held", n, held>>10)
	})
}

// A client that sends beyond the credit it was granted breaks the
// protocol: the server closes its connection and says why.
// dialRaw is a tcp-lv connection to addr with no engine on it, to send
// frames a kernrpc client never would; it is closed when t ends.
func dialRaw(t *testing.T, addr string) kernel.Conn {
	t.Helper()
	tr, err := kernel.NewTransport("tcp-lv", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestStreamBeyondCreditClosesConnection(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Streams.Window = 1 << 10
	srv := startServer(t, cfg, func(srv *kernrpc.Server) {
		var n atomic.Int64
		floodHandlers(&n, 0)(srv)
	})
	conn := dialRaw(t, srv.Addr())
	frames := []*kernel.Frame{
		{Type: kernel.FrameWindowUpdate, Credit: 1 << 20},
		{Type: kernel.FrameRequest, Flags: kernel.FlagStream, CallID: 1, Method: "Flood.In", Credit: 1 << 20},
	}
	for range 4 {
		frames = append(frames, &kernel.Frame{Type: kernel.FrameStreamData, CallID: 1, Payload: make([]byte, 1<<10)})
	}
	for _, f := range frames {
		if err := conn.WriteFrame(f); err != nil {
			break
		}
	}
	read := make(chan error, 1)
	go func() {
		for {
			f, err := conn.ReadFrame(context.Background())
			if err != nil {
				read <- err
				return
			}
			f.Release()
		}
	}()
	select {
	case <-read:
	case <-time.After(3 * time.Second):
		t.Fatal("the server kept a connection whose client sent beyond its credit")
	}
	if !eventually(2*time.Second, func() bool { return strings.Contains(logs.String(), "beyond the credit") }) {
		t.Fatalf("no log line says why the connection was closed:\n%s", logs.String())
	}
	// The line names the stream that went past its credit.
	if !strings.Contains(logs.String(), "call_id=1 ") {
		t.Fatalf("the log line does not name stream 1:\n%s", logs.String())
	}
}

// A stream closed after reading part of what arrived gives the connection
// back all of its credit: what it read but had not yet counted, and what
// it had taken from the queue unread. Otherwise the streams that follow
// on the connection would find its window spent and stall.
func TestStreamsClosedMidBatchGiveCreditBack(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		// Reads of 200 messages of 32 B each stay below the eighth of the
		// window after which the receiver counts what it read; ten streams
		// that kept that, or the rest of their batch, would spend the
		// connection's 64 KiB.
		cfg.Streams.Window, cfg.Streams.ConnectionWindow = 64<<10, 64<<10
		var sent atomic.Int64
		startServer(t, cfg, floodHandlers(&sent, 16))
		cli := newClient(t, cfg)
		for i := range 40 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Flood.Out", &echopb.Echo{})
			if err != nil {
				cancel()
				t.Fatalf("stream %d: %v", i, err)
			}
			for j := range 200 {
				if _, err := st.Recv(); err != nil {
					cancel()
					t.Fatalf("stream %d, message %d: %v (the connection's credit ran out?)", i, j, err)
				}
			}
			st.Close()
			cancel()
		}
	})
}

// A SendMsg waiting for the connection's credit (not the stream's) ends
// when its stream does: when the connection is lost (nothing will grant
// that credit again), or when the server ends the stream while another
// stream holds the connection's credit.
func TestSendWaitingForConnectionCreditEndsWithTheStream(t *testing.T) {
	for _, lose := range []bool{true, false} {
		name := "server ends the stream"
		if lose {
			name = "connection lost"
		}
		t.Run(name, func(t *testing.T) { sendWaitingForConnectionCredit(t, lose) })
	}
}

func sendWaitingForConnectionCredit(t *testing.T, lose bool) {
	ln := listenTCPLV(t)
	gotOne, cut := make(chan struct{}), make(chan struct{})
	served := make(chan struct{})
	t.Cleanup(func() { <-served })
	go func() {
		defer close(served)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := ln.Accept(ctx)
		if err != nil {
			close(gotOne)
			return
		}
		defer c.Close()
		var ids []uint64
		for {
			f, err := c.ReadFrame(ctx)
			if err != nil {
				return
			}
			switch {
			case f.Type == kernel.FrameRequest && f.Flags&kernel.FlagStream != 0:
				// A small connection window, large stream windows: the
				// connection's runs out first.
				if len(ids) == 0 {
					_ = c.WriteFrame(&kernel.Frame{Type: kernel.FrameWindowUpdate, Credit: 64 << 10})
				}
				ids = append(ids, f.CallID)
				_ = c.WriteFrame(&kernel.Frame{Type: kernel.FrameWindowUpdate, CallID: f.CallID, Credit: 1 << 20})
			case f.Type == kernel.FrameStreamData:
				// The first message, on the first stream, holds half the
				// connection's credit, and this server never grants it back.
				close(gotOne)
				f.Release()
				<-cut
				if lose {
					return // closes the connection
				}
				_ = c.WriteFrame(&kernel.Frame{Type: kernel.FrameResponse, Flags: kernel.FlagEndStream, CallID: ids[1], Code: kernel.Aborted, Message: "ended by the server"})
				continue
			}
			f.Release()
		}
	}()

	cfg := testConfig(t)
	cfg.Transport.Options = nil // the fake server's tcp-lv takes pings 1s apart at most
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{ln.Addr()}}
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := cli.NewStream(ctx, "Flood.In")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := cli.NewStream(ctx, "Flood.In")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	m := &echopb.Echo{Payload: make([]byte, 32<<10)}
	if err := first.SendMsg(m); err != nil {
		t.Fatalf("first send: %v", err)
	}
	receive(t, gotOne, 5*time.Second, "the server did not get the first message")
	sent := make(chan error, 1)
	go func() { sent <- second.SendMsg(m) }() // 32 KiB more past half of 64 KiB: waits
	select {
	case err := <-sent:
		t.Fatalf("the second send did not wait for credit: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(cut)
	start := time.Now()
	want := kernel.Aborted
	if lose {
		want = kernel.Unavailable
	}
	select {
	case err := <-sent:
		if kernel.CodeOf(err) != want {
			t.Errorf("the waiting send ended with %v, want %v", err, want)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("SendMsg still waits for the connection's credit %v after its stream ended", time.Since(start))
		cancel()
		<-sent
	}
}

// An application that reads the one message each of several streams has
// received, and then waits on another stream of the connection, has read
// everything it received: the credit of what it read must come back
// (docs/protocol.md: the receiver counts what it read "whenever it has read
// all it has received"), or the sender of the stream it waits on finds the
// connection's window spent, and both wait for ever. Both ways: the client
// reading the servers' messages, and server-streaming handlers reading
// their one request.
func TestReadingAllReceivedGrantsTheConnectionsCredit(t *testing.T) {
	for _, dir := range []string{"client reads", "server reads"} {
		t.Run(dir, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
				readingAllReceivedGrants(t, cfg, dir == "server reads")
			})
		})
	}
}

func readingAllReceivedGrants(t *testing.T, cfg *kernrpc.Config, serverReads bool) {
	// A 64 KiB window is counted in chunks of 8 KiB: each message below,
	// read alone, stays under a chunk, and five of them are past half the
	// connection's window.
	cfg.Streams.Window, cfg.Streams.ConnectionWindow = 64<<10, 64<<10
	startServer(t, cfg, func(srv *kernrpc.Server) {
		// Snap.Once sends one message of as many bytes as the request's
		// text says, then waits for the stream's end.
		kernrpc.HandleServerStream(srv, "Snap.Once", func(ctx context.Context, req *echopb.Echo, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			n, _ := strconv.Atoi(req.Text)
			if err := st.Send(&echopb.Echo{Payload: make([]byte, n)}); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// open opens a Snap.Once stream with a request of reqSize bytes, for
	// a message of respSize, and reads that message.
	open := func(reqSize, respSize int) error {
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Snap.Once",
			&echopb.Echo{Text: strconv.Itoa(respSize), Payload: make([]byte, reqSize)})
		if err != nil {
			return err
		}
		t.Cleanup(func() { st.Close() })
		_, err = st.Recv()
		return err
	}
	small, big := [2]int{0, 7000}, [2]int{0, 32 << 10}
	if serverReads {
		small, big = [2]int{7000, 0}, [2]int{32 << 10, 0}
	}
	for i := range 5 {
		if err := open(small[0], small[1]); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	// 32 KiB more than the 35 KiB outstanding passes the 64 KiB window:
	// its sender waits for the credit of what was read.
	got := make(chan error, 1)
	go func() { got <- open(big[0], big[1]) }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the last stream: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the last stream's 32 KiB message never came: the credit of the messages read on the other streams was not granted back")
	}
}

// undersizeCodec is protobuf with a Size 8 bytes short of the encoding:
// kernel.CodecSizer promises no exact size, and a sender that took credit
// for the smaller size must still keep to the receiver's window.
type undersizeCodec struct{ protobuf.Codec }

func (undersizeCodec) Name() string { return "test-undersize" }

func (c undersizeCodec) Size(v any) int {
	if n := c.Codec.Size(v); n > 8 {
		return n - 8
	}
	return 0
}

func (c undersizeCodec) MarshalSized(dst []byte, v any, _ int) ([]byte, error) {
	return c.Codec.Marshal(dst, v)
}

func init() {
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-undersize",
		Doc:  "protobuf whose Size is 8 bytes short (kernel tests)",
		New:  func(any) (kernel.Codec, error) { return undersizeCodec{}, nil },
	})
}

// A message whose encoding came out larger than the codec's size said
// costs what it encoded to, and waits for that credit: taking the
// difference without looking would send past the receiver's window,
// which closes the connection.
func TestStreamSendOfAMessageLargerThanItsSizeKeepsToTheWindow(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Codec.Name = "test-undersize"
	// Messages of 242 bytes cost 258 each: three hold 774 of the 1 KiB
	// window, past its half, and a fourth (sized 250) would go past it.
	cfg.Streams.Window, cfg.Streams.ConnectionWindow = 1<<10, 1<<10
	release := make(chan struct{})
	startServer(t, cfg, func(srv *kernrpc.Server) {
		kernrpc.HandleClientStream(srv, "Count.In", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			n := 0
			for {
				if _, err := st.Recv(); err == io.EOF {
					return &echopb.Echo{Text: strconv.Itoa(n)}, nil
				} else if err != nil {
					return nil, err
				}
				n++
			}
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.In")
	if err != nil {
		t.Fatal(err)
	}
	m := &echopb.Echo{Payload: make([]byte, 239)}
	for i := range 3 {
		if err := st.Send(m); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	type result struct {
		resp *echopb.Echo
		err  error
	}
	done := make(chan result, 1)
	go func() {
		if err := st.Send(m); err != nil {
			done <- result{nil, err}
			return
		}
		resp, err := st.CloseAndRecv()
		done <- result{resp, err}
	}()
	close(release)
	r := receive(t, done, 5*time.Second, "the stream did not end")
	if r.err != nil || r.resp.Text != "4" {
		t.Fatalf("the server read %v messages of 4, and the stream ended with %v\n%s", r.resp, r.err, logs.String())
	}
	if strings.Contains(logs.String(), "beyond the credit") {
		t.Fatalf("the server saw data beyond the credit it granted:\n%s", logs.String())
	}
}
