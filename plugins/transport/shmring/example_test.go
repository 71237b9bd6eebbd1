//go:build linux

package shmring_test

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

// The echo example runs over shm-ring when its config's transport block
// becomes `transport: {name: shm-ring}`, as the config's comment says.
func TestEchoExampleConfigRunsOverShmRing(t *testing.T) {
	yaml, err := os.ReadFile("../../../examples/echo/kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?m)^transport:\n(?:[ \t]+.*\n)*`)
	if !block.Match(yaml) {
		t.Fatal("examples/echo/kernrpc.yaml has no transport block")
	}
	swapped := block.ReplaceAll(yaml, []byte("transport: {name: shm-ring}\n"))
	cfg, err := kernrpc.ParseConfig(swapped, "examples/echo/kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Registry.Options = map[string]any{"namespace": t.Name()}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Echo", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	if got := srv.Instance().Metadata["transport"]; got != "shm-ring" {
		t.Fatalf("the server runs %q", got)
	}
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var resp echopb.Echo
	if err := cli.Call(ctx, "Echo.Echo", &echopb.Echo{Text: "hello, shm"}, &resp); err != nil || resp.Text != "hello, shm" {
		t.Fatalf("echo over the example's config: %v %q", err, resp.Text)
	}
}
