package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
)

// A rolling restart under load: two servers, and eight times a new one
// starts and the oldest shuts down, while 12 callers make calls of 16 B,
// 300 B and 64 KiB and 4 more open server streams. No call or stream may fail:
// what a server shutting down did not serve goes elsewhere. (Streams
// opened as a shutdown began failed before its two-step drain.)
func TestRollingRestartLosesNoCallOrStream(t *testing.T) {
	forEachTransport(t, func(t *testing.T, cfg *kernrpc.Config) {
		start := func() *kernrpc.Server { return startServer(t, cfg, streamHandlers) }
		live := []*kernrpc.Server{start(), start()}
		cli := newClient(t, cfg)

		// Read only, by the callers' marshalling: shared.
		payloads := [][]byte{make([]byte, 16), make([]byte, 64<<10), make([]byte, 300)}
		calls := enginetest.StartLoad("calls", 12, func(i int) error {
			payload := payloads[i%3]
			var resp echopb.Echo
			if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Payload: payload}, &resp); err != nil {
				return err
			}
			if len(resp.Payload) != len(payload) {
				return errors.New("echo of " + strconv.Itoa(len(payload)) + " bytes came back with " + strconv.Itoa(len(resp.Payload)))
			}
			return nil
		})
		streams := enginetest.StartLoad("streams", 4, func(i int) error {
			return countUp(cli, payloads[i%3], 5)
		})
		for range 8 {
			time.Sleep(100 * time.Millisecond)
			live = append(live, start())
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := live[0].Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			cancel()
			live = live[1:]
		}
		calls.Stop()
		streams.Stop()
		t.Logf("%s and %s through 8 restarts", calls, streams)
		calls.Check(t, 100)
		streams.Check(t, 20)
	})
}

// countUp opens Count.Up for n messages carrying payload and reads them
// all, in order.
func countUp(cli *kernrpc.Client, payload []byte, n int) error {
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](context.Background(), cli, "Count.Up")
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Send(&echopb.Echo{Text: strconv.Itoa(n), Payload: payload}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	for got := 0; ; got++ {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if got != n {
				return errors.New("stream ended after " + strconv.Itoa(got) + " of " + strconv.Itoa(n) + " messages")
			}
			return nil
		}
		if err != nil {
			return err
		}
		if m.Text != strconv.Itoa(got) || len(m.Payload) != len(payload) {
			return errors.New("message " + strconv.Itoa(got) + " came as " + m.Text)
		}
	}
}
