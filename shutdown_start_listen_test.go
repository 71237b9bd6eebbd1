package kernrpc_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// slowListenTCP is tcp-lv whose Listen tells entered it began, then waits
// for gate before listening, as a Listen that takes its time (net's
// Listen of a literal address does not look at its context at all).
type slowListenTCP struct {
	kernel.Transport
	entered chan struct{}
	gate    chan struct{}
	addr    string // the address it listened on
}

func (s *slowListenTCP) Listen(ctx context.Context, addr string) (kernel.Listener, error) {
	close(s.entered)
	<-s.gate
	ln, err := s.Transport.Listen(ctx, addr)
	if err == nil {
		s.addr = ln.Addr()
	}
	return ln, err
}

var slowListen = &slowListenTCP{}

func init() {
	registerTCPWrapper("test-slow-listen-tcp", "test: tcp-lv whose Listen waits for a gate", &slowListen.Transport, slowListen)
}

// A Shutdown whose context is already over, called while Start is still
// listening, must not return while that Start goes on to serve: once
// Shutdown has returned, nothing may accept connections.
func TestShutdownInAHurryDuringStartLeavesNothingServing(t *testing.T) {
	slowListen.entered, slowListen.gate = make(chan struct{}), make(chan struct{})
	cfg := testConfig(t)
	cfg.Transport.Name, cfg.Transport.Options = "test-slow-listen-tcp", nil
	cfg.Address = "127.0.0.1:0"
	cfg.Service = "" // no registry write, which would notice the cancelled start
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- srv.Start(context.Background()) }()
	receive(t, slowListen.entered, 10*time.Second, "Start never reached Listen")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	returned := false
	select {
	case <-shut:
		returned = true
	case <-time.After(100 * time.Millisecond): // Shutdown waits for Start: let Start go on
	}
	close(slowListen.gate)
	if err := receive(t, started, 10*time.Second, "Start did not return"); err == nil {
		t.Error("Start returned nil after a Shutdown that had finished: it says it serves")
	}
	if !returned {
		receive(t, shut, 10*time.Second, "Shutdown did not return")
	}
	if addr := slowListen.addr; addr == "" {
		t.Fatal("Start never listened")
	} else if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Shutdown returned", addr)
	}
}
