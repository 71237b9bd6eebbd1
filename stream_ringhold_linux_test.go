package kernrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	_ "github.com/kernrpc/kernrpc/plugins/codec/json"
)

// A codec that cannot tell sizes (json) encodes a stream message into the
// buffer the transport lends before the sender knows whether it has the
// credit to send it. On shm-ring that buffer is ring space: senders
// blocked on credit must not keep it, or enough of them (streams whose
// receivers stopped reading) leave no room in the ring for the other calls
// of the connection, whose peer reads every frame promptly.
func TestStreamSendersBlockedOnCreditHoldNoRingSpace(t *testing.T) {
	cfg := testConfig(t)
	cfg.Transport.Name = "shm-ring"
	cfg.Transport.Options = map[string]any{"ring_size": "16KiB"}
	cfg.Codec = kernrpc.PluginConfig{Name: "json"}
	cfg.Streams.Window = 1 << 10
	release := make(chan struct{})
	startServer(t, cfg, func(srv *kernrpc.Server) {
		// Hold.Still never reads its stream until the test is over.
		kernrpc.HandleClientStream(srv, "Hold.Still", func(ctx context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) (*echopb.Echo, error) {
			select {
			case <-ctx.Done():
			case <-release:
			}
			return &echopb.Echo{}, nil
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		close(release)
		wg.Wait()
	})

	// Each stream's messages (about 200 bytes in json, well inside the
	// 512 the ring lends a codec that cannot tell the size) spend its
	// 1KiB window in four; the fifth waits. More streams wait so than the
	// 16KiB ring has room for one lent buffer each (768 bytes with its
	// record's headers). The streams are filled one after the other, so
	// that each fifth message finds the ring as the reader left it.
	const streams = 40
	msg := &echopb.Echo{Text: strings.Repeat("x", 180)}
	for range streams {
		st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Hold.Still")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if err := st.Send(msg); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.Close()
			for i := 4; ; i++ {
				if err := st.Send(msg); err != nil {
					if ctx.Err() == nil {
						t.Errorf("send %d: %v", i, err)
					}
					return
				}
			}
		}()
		time.Sleep(5 * time.Millisecond) // its fifth message waits for credit
	}

	// A unary call on the same connection, larger than the gaps that
	// messages sent and read leave between held buffers: it must get
	// through, however many stream senders wait for credit.
	done := make(chan error, 1)
	go func() {
		var resp echopb.Echo
		done <- cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: strings.Repeat("y", 2<<10)}, &resp)
	}()
	if err := receive(t, done, 10*time.Second, "a unary call behind stream senders blocked on credit never ended"); err != nil {
		t.Fatalf("a unary call on the connection of %d streams blocked on credit: %v", streams, err)
	}
}
