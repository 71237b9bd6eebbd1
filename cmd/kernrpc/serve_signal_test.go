//go:build unix

package main

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
)

// The first Ctrl-C stops serve gracefully, which may take a while (here
// the hour-long drain period); a second one ends that wait at once, and
// serve returns, having closed what it holds.
func TestServeSecondInterruptStopsAtOnce(t *testing.T) {
	cfg := writeConfig(t, "service: echo\naddress: 127.0.0.1:0\nregistry: {name: memory, options: {namespace: cmd-serve-signal}}\n"+
		"server: {drain_period: 1h, shutdown_timeout: 1h}\n")
	// This test's own handler keeps the test process alive whatever
	// serve does with the signals.
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)

	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(context.Background(), []string{"serve", "-config", cfg}, &out, &errOut) }()
	waitFor := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), what); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("serve never printed %q:\n%s\n%s", what, out.String(), errOut.String())
			}
		}
	}
	waitFor("serving echo on")
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor("shutting down (waiting")
	if !strings.Contains(out.String(), "Ctrl-C again to stop at once") {
		t.Errorf("serve does not say a second Ctrl-C stops at once:\n%s", out.String())
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still waiting 10s after the second Ctrl-C:\n%s", out.String())
	}
}
