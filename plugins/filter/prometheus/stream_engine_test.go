package prometheus_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

type chatStream = kernrpc.ServerStreamOf[wrapperspb.StringValue, wrapperspb.StringValue]

// chatHandler serves Echo.Chat, a bidirectional stream that answers every
// message with itself until the client closes its side, and ends with
// FailedPrecondition at a message saying "fail".
func chatHandler(srv *kernrpc.Server) {
	kernrpc.HandleBidiStream(srv, "Echo.Chat", func(ctx context.Context, st chatStream) error {
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if m.GetValue() == "fail" {
				return kernel.Errorf(kernel.FailedPrecondition, "not now")
			}
			if err := st.Send(m); err != nil {
				return err
			}
		}
	})
}

// chatBurst opens streams Echo.Chat streams from 4 goroutines, each
// sending msgs messages and reading their echoes while it sends, then
// closing its side and reading the end; and one more that fails.
func chatBurst(t *testing.T, cli *kernrpc.Client, streams, msgs int) {
	t.Helper()
	ctx := t.Context()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range work {
				if err := chat(ctx, cli, msgs); err != nil {
					t.Errorf("Echo.Chat: %v", err)
					return
				}
			}
		})
	}
	for i := range streams {
		work <- i
	}
	close(work)
	wg.Wait()
	st, err := kernrpc.OpenStream[wrapperspb.StringValue, wrapperspb.StringValue](ctx, cli, "Echo.Chat")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(wrapperspb.String("fail")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); kernel.CodeOf(err) != kernel.FailedPrecondition {
		t.Fatalf("the failing stream ended with %v, want FailedPrecondition", err)
	}
}

// chat is one Echo.Chat stream of n messages, sent while their echoes are
// read.
func chat(ctx context.Context, cli *kernrpc.Client, n int) error {
	st, err := kernrpc.OpenStream[wrapperspb.StringValue, wrapperspb.StringValue](ctx, cli, "Echo.Chat")
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		for range n {
			if err := st.Send(wrapperspb.String(strings.Repeat("x", 10))); err != nil {
				sent <- err
				return
			}
		}
		sent <- st.CloseSend()
	}()
	got := 0
	for {
		_, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got++
	}
	if err := <-sent; err != nil {
		return err
	}
	if got != n {
		return errors.New("echoes lost")
	}
	return nil
}

// Over the engine (tcp-lv): after a burst of streams through a real
// server and client, each side's /metrics counts them started and ended
// by code, none in flight, and every message each way, and passes
// promtool check metrics.
func TestStreamsOverTheEngine(t *testing.T) {
	const streams, msgs = 20, 25
	_, cli, sf, cf := echoService(t, echoYAML)
	chatBurst(t, cli, streams, msgs)

	chatLabels := labels{"service": "Echo", "method": "Chat"}
	for _, side := range []struct {
		name           string
		url            string
		sent, received float64
	}{
		// The failing stream's one message reaches the server, which
		// answers none.
		{"server", serve(t, sf.Handler()), streams * msgs, streams*msgs + 1},
		{"client", serve(t, cf.Handler()), streams*msgs + 1, streams * msgs},
	} {
		t.Run(side.name, func(t *testing.T) {
			p := "kernrpc_" + side.name + "_"
			// A client's stream ends, for its filter, just after the
			// caller read the end, on the engine's goroutine.
			body, fams := scrapeUntil(t, side.url, func(fams map[string]*dto.MetricFamily) bool {
				f, ok := fams[p+"streams_ended_total"]
				if !ok {
					return false
				}
				var ended float64
				for _, m := range f.GetMetric() {
					ended += m.GetCounter().GetValue()
				}
				return ended >= streams+1
			})
			for _, c := range []struct {
				name string
				l    labels
				want float64
			}{
				{p + "streams_started_total", chatLabels, streams + 1},
				{p + "streams_ended_total", labels{"service": "Echo", "method": "Chat", "code": "OK"}, streams},
				{p + "streams_ended_total", labels{"service": "Echo", "method": "Chat", "code": "FailedPrecondition"}, 1},
				{p + "streams_in_flight", chatLabels, 0},
				{p + "stream_messages_sent_total", chatLabels, side.sent},
				{p + "stream_messages_received_total", chatLabels, side.received},
			} {
				if got := value(t, fams, c.name, c.l); got != c.want {
					t.Errorf("%s%v = %g, want %g", c.name, c.l, got, c.want)
				}
			}
			if _, ok := fams[p+"calls_total"]; ok {
				t.Errorf("streams counted as calls in %scalls_total", p)
			}
			promtool(t, body)
		})
	}
}
