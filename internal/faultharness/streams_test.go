package faultharness_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echostream"
	"github.com/kernrpc/kernrpc/kernel"
)

const chatMethod = "Harness.Chat"

// streamFrames are the frames a stream's faults hit: all of a stream's,
// for the faults a stream survives or fails by (a delay, a reset).
var streamFrames = []any{"request", "response", "cancel", "stream_data", "window_update"}

// streamKinds are the faults a stream must meet with a clean outcome.
// Loss and duplication hit requests, answers and cancels only: a stream
// relies on its transport to deliver its messages once and in order.
var streamKinds = []kind{
	{name: "delay", faults: map[string]any{"delay": "1ms", "delay_jitter": "5ms", "frames": streamFrames}},
	{name: "drop", faults: map[string]any{"drop": 0.03}},
	{name: "duplicate", faults: map[string]any{"duplicate": 0.1}},
	{name: "reset", faults: map[string]any{"reset": 0.001, "frames": streamFrames}},
	{name: "reset-after", faults: map[string]any{"reset_after": 200, "frames": streamFrames}},
}

// TestStreamsThroughFaultsEndCleanly runs bidirectional streams through
// each fault in streamKinds: every stream must end either with all its
// messages echoed intact and io.EOF, or with its deadline or Unavailable;
// none may read a message that is not the one due, and nothing may
// outlive the client and the server.
func TestStreamsThroughFaultsEndCleanly(t *testing.T) {
	for _, tr := range harnessTransports() {
		for _, k := range streamKinds {
			t.Run(tr+"/"+k.name, func(t *testing.T) {
				r := &run{transport: tr, faults: k.faults, calls: 200, concurrency: 32, deadline: time.Second}
				r.streams(t)
			})
		}
	}
}

// streams runs r.calls chats of 8 messages, r.concurrency at a time, and
// checks how each ended.
func (r *run) streams(t *testing.T) {
	fds := openFDs(t)
	leaks := goleak.IgnoreCurrent()
	cfg := r.config(t)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.HandleBidiStream(srv, chatMethod, echostream.Serve[wrapperspb.StringValue])
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	codes := make(map[kernel.Code]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, r.concurrency)
	for i := range r.calls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := r.chat(cli, i)
			mu.Lock()
			defer mu.Unlock()
			switch code := kernel.CodeOf(err); {
			case err == nil, code == kernel.DeadlineExceeded, code == kernel.Unavailable:
				codes[code]++
			default:
				if codes[code]++; codes[code] <= 5 {
					t.Errorf("stream %d: %v; want it to end OK, by its deadline or with Unavailable", i, err)
				}
			}
		})
	}
	wg.Wait()
	cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	t.Logf("%v over %s: %d streams: outcomes %v", r.faults, r.transport, r.calls, codes)
	if codes[kernel.OK] == 0 {
		t.Errorf("no stream ended OK; the fault left nothing to check")
	}
	if err := goleak.Find(leaks); err != nil {
		t.Errorf("goroutines outlived the server and the client: %v", err)
	}
	if err := fdsBackTo(fds); err != nil {
		t.Error(err)
	}
}

// chat sends 8 messages on a stream of its own, reading each echo before
// the next; a message other than the one due is an Internal error here,
// which the caller reports.
func (r *run) chat(cli *kernrpc.Client, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.deadline)
	defer cancel()
	st, err := kernrpc.OpenStream[wrapperspb.StringValue, wrapperspb.StringValue](ctx, cli, chatMethod)
	if err != nil {
		return err
	}
	defer st.Close()
	for j := range 8 {
		want := "stream " + strconv.Itoa(i) + " message " + strconv.Itoa(j)
		if err := st.Send(wrapperspb.String(want)); err != nil {
			return err
		}
		got, err := st.Recv()
		if err != nil {
			return err
		}
		if got.GetValue() != want {
			return kernel.Errorf(kernel.Internal, "read %q where %q was due", got.GetValue(), want)
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if m, err := st.Recv(); !errors.Is(err, io.EOF) {
		if err == nil {
			return kernel.Errorf(kernel.Internal, "read %q after the last message", m.GetValue())
		}
		return err
	}
	return nil
}
