package kernrpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// A stream picks an instance as a call does: one whose dial was refused
// moments ago is passed over while the balancer offers another, rather
// than dialled again for every stream that picks it (each of which, with
// no retries left, fails).
func TestAStreamPassesOverAnInstanceThatRefusedADial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there: its dials are refused

	cfg := testConfig(t)
	startServer(t, cfg, streamHandlers)
	ccfg := *cfg
	ccfg.Registry.Options = map[string]any{"namespace": t.Name(), "static": map[string]any{"echo": []any{dead}}}
	zero := 0
	ccfg.Client.Retries = &zero
	cli := newClient(t, &ccfg)

	failed := 0
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := kernrpc.OpenServerStream[echopb.Echo, echopb.Echo](ctx, cli, "Count.Up", &echopb.Echo{Text: "2"})
		for n := 0; err == nil; n++ {
			if _, err = st.Recv(); errors.Is(err, io.EOF) && n == 2 {
				err = nil
				break
			}
		}
		cancel()
		if err != nil {
			if kernel.CodeOf(err) != kernel.Unavailable {
				t.Fatalf("stream %d: %v; want it served, or Unavailable for the dead instance", i, err)
			}
			failed++
			t.Logf("stream %s: %v", strconv.Itoa(i), err)
		}
	}
	if failed > 1 {
		t.Errorf("%d of 10 streams failed on the instance whose dial was refused; want 1 at most: once refused, it is passed over for the live one", failed)
	}
}
