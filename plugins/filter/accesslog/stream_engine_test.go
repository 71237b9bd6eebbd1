package accesslog_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/accesslog"
)

type echoStream = kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]

// Over the engine (tcp-lv), the filter on both sides: each stream is one
// line per side once it ends, with the messages each side sent and
// received, their bytes, the peer and the code.
func TestStreamsOverTheEngine(t *testing.T) {
	out := enginetest.DefaultLog(t)

	cfg := enginetest.WithFilters(enginetest.Config(t), kernrpc.FilterConfig{Name: accesslog.Name})
	srv := enginetest.Serve(t, cfg, func(srv *kernrpc.Server) {
		// Chat.Echo answers every message with itself, and one more at the end.
		kernrpc.HandleBidiStream(srv, "Chat.Echo", func(ctx context.Context, st echoStream) error {
			for {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return st.Send(&echopb.Echo{Text: "bye"})
				}
				if err != nil {
					return err
				}
				if m.Text == "fail" {
					return kernel.Errorf(kernel.FailedPrecondition, "not now")
				}
				if err := st.Send(m); err != nil {
					return err
				}
			}
		})
	})
	cli := enginetest.Dial(t, cfg)
	ctx := t.Context()

	const n = 50
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Chat.Echo")
	if err != nil {
		t.Fatal(err)
	}
	msgBytes := 0
	for i := range n {
		m := &echopb.Echo{Text: strconv.Itoa(i)}
		msgBytes += m.SizeVT()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	failing, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Chat.Echo")
	if err != nil {
		t.Fatal(err)
	}
	if err := failing.Send(&echopb.Echo{Text: "fail"}); err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Recv(); kernel.CodeOf(err) != kernel.FailedPrecondition {
		t.Fatalf("the failing stream ended with %v", err)
	}

	// The client's line comes once its filter sees the caller done, on the
	// engine's goroutine: wait for all four.
	var streams []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		streams = streams[:0]
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.Contains(l, "msg=stream") {
				streams = append(streams, l)
			}
		}
		if len(streams) >= 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, l := range streams {
		t.Log(l)
	}
	if len(streams) != 4 {
		t.Fatalf("%d stream lines, want 4 (two streams, each logged on both sides)", len(streams))
	}
	bye := (&echopb.Echo{Text: "bye"}).SizeVT()
	fail := (&echopb.Echo{Text: "fail"}).SizeVT()
	want := map[string][]string{
		"side=server code=OK": {"level=INFO", "method=Chat.Echo", "peer=127.0.0.1:",
			"sent_msgs=" + strconv.Itoa(n+1), "recv_msgs=" + strconv.Itoa(n),
			"sent_bytes=" + strconv.Itoa(msgBytes+bye), "recv_bytes=" + strconv.Itoa(msgBytes)},
		"side=client code=OK": {"level=INFO", "method=Chat.Echo", "peer=" + srv.Addr(), "attempt=1",
			"sent_msgs=" + strconv.Itoa(n), "recv_msgs=" + strconv.Itoa(n+1),
			"sent_bytes=" + strconv.Itoa(msgBytes), "recv_bytes=" + strconv.Itoa(msgBytes+bye)},
		"side=server code=FailedPrecondition": {"level=WARN", "sent_msgs=0 recv_msgs=1", "recv_bytes=" + strconv.Itoa(fail), `err="not now"`},
		"side=client code=FailedPrecondition": {"level=WARN", "sent_msgs=1 recv_msgs=0", "sent_bytes=" + strconv.Itoa(fail), `err="not now"`},
	}
	for key, parts := range want {
		var line string
		for _, l := range streams {
			side, code, _ := strings.Cut(key, " ")
			if strings.Contains(l, side) && strings.Contains(l, code+" ") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("no line with %s", key)
			continue
		}
		for _, p := range parts {
			if !strings.Contains(line, p) {
				t.Errorf("the %s line %q does not say %q", key, line, p)
			}
		}
	}
}
