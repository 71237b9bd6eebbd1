package faultharness_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// Every request frame arrives twice, the copy right behind the first:
// served inline, the first has finished by the time the copy is read, so
// only the server's memory of the call ids it saw keeps the copy from
// running again, and the copy must get no answer of its own that could
// reach the caller in place of the call's.
func TestDuplicatedRequestFramesRunOnceAndAnswerOnce(t *testing.T) {
	r := &run{transport: "tcp-lv", faults: map[string]any{"duplicate": 1, "side": "dial", "frames": []any{"request"}}}
	cfg := r.config(t)
	var runs [200]atomic.Int32
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, method, func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		i, _ := strconv.Atoi(kernrpc.IncomingMetadata(ctx)[idKey])
		runs[i].Add(1)
		return req, nil
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i := range runs {
		id := strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(kernrpc.WithMetadata(context.Background(), kernel.Metadata{idKey: id}), 2*time.Second)
		var resp wrapperspb.StringValue
		err := cli.Call(ctx, method, wrapperspb.String(payload(id)), &resp)
		cancel()
		if err != nil || resp.GetValue() != payload(id) {
			t.Fatalf("call %d: %v, answer %q; a duplicated request must not change the call's answer", i, err, resp.GetValue())
		}
	}
	cli.Close()
	srv.Shutdown(context.Background())
	for i := range runs {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("call %d ran %d times; its duplicate must not run", i, n)
		}
	}
}
