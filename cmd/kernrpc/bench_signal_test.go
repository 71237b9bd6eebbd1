//go:build unix

package main

import (
	"context"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/syncbuf"
)

// Ctrl-C during a bench ends the run early and prints the figures so far,
// exit 0; the calls it cut short are not counted as failures of the
// server. The server here is not kernrpc serve, whose own Ctrl-C handling
// would stop it too.
func TestBenchInterruptedPrintsTheFiguresSoFar(t *testing.T) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Address = "127.0.0.1:0"
	cfg.Registry = kernrpc.PluginConfig{Name: "memory", Options: map[string]any{"namespace": "cmd-bench-signal"}}
	cfg.Server.Reflection = true
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, echoMethod, func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil })
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	// This test's own handler keeps the test process alive whatever bench
	// does with the signal.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runIO(ctx, []string{"bench", srv.Addr(), echoM, `{"text":"hi"}`, "-c", "2", "-d", "30s"}, strings.NewReader(""), &out, &errOut)
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errOut.String(), "1s/30s"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("no progress line: %s", errOut.String())
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(10 * time.Second):
		cancel() // what the signal should have done
		<-done
		t.Fatalf("bench ran on 10s after Ctrl-C; stdout:\n%s", out.String())
	}
	if code != 0 {
		t.Fatalf("bench interrupted: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	m := regexp.MustCompile(`calls +(\d+) \((\d+) OK, 0 errors\)`).FindStringSubmatch(out.String())
	if m == nil || m[1] != m[2] || m[1] == "0" || strings.Contains(out.String(), "Canceled") {
		t.Errorf("bench interrupted: want N calls, all OK, none Canceled:\n%s", out.String())
	}
}
