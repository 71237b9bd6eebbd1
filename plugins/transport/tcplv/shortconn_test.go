package tcplv

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/raceflag"
	"github.com/kernrpc/kernrpc/kernel"
)

// A short connection (dial, one round trip, close) must not cost a read
// buffer of its own: the closed connection gives it back, by Close or by
// the reader that saw the peer go.
func TestClosedConnectionsGiveTheirReadBufferBack(t *testing.T) {
	client, server := connPair(t, testOptions())
	roundTrip(t, client, server)
	client.Close()
	if client.br != nil {
		t.Error("Close kept the read buffer of a connection nobody reads")
	}
	if _, err := server.ReadFrame(context.Background()); err == nil {
		t.Fatal("ReadFrame on a connection whose peer closed returned no error")
	}
	if server.br != nil {
		t.Error("the reader that saw its peer go kept the read buffer")
	}
	// Once given back, the buffer is never touched again.
	if n := client.Buffered(); n != 0 {
		t.Errorf("Buffered after Close = %d, want 0", n)
	}
	if _, err := client.ReadFrame(context.Background()); err == nil {
		t.Error("ReadFrame after Close returned no error")
	}
}

// A connection whose frames all leave inline starts no writer goroutine;
// the first frame that waits for one starts it.
func TestWriterStartsOnFirstQueuedFrame(t *testing.T) {
	client, server := connPair(t, testOptions())
	roundTrip(t, client, server)
	if client.writerOn.Load() {
		t.Error("a lone request written inline started the writer goroutine")
	}
	f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2, Method: "Echo.Say", Payload: []byte("queued")}
	if err := client.QueueFrame(f); err != nil {
		t.Fatal(err)
	}
	got, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("a queued frame never arrived: %v", err)
	}
	if string(got.Payload) != "queued" || !client.writerOn.Load() {
		t.Errorf("got %q with writer started %v, want the queued frame sent by a started writer", got.Payload, client.writerOn.Load())
	}
	got.Release()
}

// What a short connection allocates, both ends together, stays below the
// two read buffers they would make afresh (about 10 KB of it is the rest
// of a connection: sockets, addresses, timers).
func TestShortConnectionsReuseReadBuffers(t *testing.T) {
	if raceflag.Enabled {
		t.Skip("the race detector makes sync.Pool drop buffers on purpose")
	}
	tr := newTransport(t, testOptions())
	ln := listen(t, tr)
	short := func() {
		client := dial(t, tr, ln.Addr())
		server := accept(t, ln)
		roundTrip(t, client, server)
		client.Close()
		server.ReadFrame(context.Background()) // sees the close and gives the buffer back
		server.Close()
	}
	for range 10 {
		short()
	}
	const n = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		short()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per >= 2*defaultReadBufferSize {
		t.Errorf("a short connection allocated %d bytes for both ends, want less than two %d-byte read buffers", per, defaultReadBufferSize)
	}
}

// roundTrip sends one request from client and reads it at server.
func roundTrip(t *testing.T, client, server *conn) {
	t.Helper()
	f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1, Method: "Echo.Say", Payload: []byte("hi")}
	if err := client.WriteFrame(f); err != nil {
		t.Fatal(err)
	}
	got, err := server.ReadFrame(timeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got.Release()
}
