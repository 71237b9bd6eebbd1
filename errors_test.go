package kernrpc_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// Error texts name each thing once: the config file, the plugin, the
// address, the operation.
func TestListenErrorNamesEachThingOnce(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := testConfig(t)
	cfg.Address, cfg.Source = taken.Addr().String(), "svc.yaml"
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Start(context.Background())
	want := `kernrpc: svc.yaml: transport "tcp-lv": listen tcp ` + cfg.Address + ": bind: address already in use"
	if err == nil || err.Error() != want {
		t.Fatalf("Start on a taken port: %v\nwant: %s", err, want)
	}
	_ = srv.Shutdown(context.Background())
}

func TestDialErrorNamesEachThingOnce(t *testing.T) {
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	cfg := testConfig(t)
	cfg.Registry.Options["static"] = map[string]any{"echo": []any{addr}}
	*cfg.Client.Retries = 0
	cli := newClient(t, cfg)
	err = cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{}, &echopb.Echo{})
	msg := kernel.StatusOf(err).Message
	if kernel.CodeOf(err) != kernel.Unavailable || !strings.HasPrefix(msg, `transport "tcp-lv": dial tcp `+addr+": connect: connection refused") {
		t.Fatalf("call to a closed port: %v; want Unavailable naming the transport and address once", err)
	}
	if strings.Count(msg, addr) != 1 || strings.Count(msg, "tcp-lv") != 1 {
		t.Errorf("message %q repeats itself", msg)
	}
}

func TestPluginErrorsShareOneShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  string
		want string
	}{
		{"unknown name", "transport: tcpx\n", `kernrpc: svc.yaml: transport "tcpx": no transport of that name is registered (known: `},
		{"bad option", "transport: {name: tcp-lv, options: {max_frame_size: huge}}\n", `kernrpc: svc.yaml: transport "tcp-lv": option "max_frame_size": bad size "huge"`},
		{"unknown option", "codec: {name: protobuf, options: {fast: true}}\n", `kernrpc: svc.yaml: codec "protobuf": option "fast": unknown key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kernrpc.ParseConfig([]byte(tc.cfg), "svc.yaml")
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to start: %s", err, tc.want)
			}
		})
	}
	// An error from the plugin's New, with the plugin's own prefix, reads
	// the same and does not name the plugin twice.
	_, err := kernel.NewFactory("picky", "", func() *struct{} { return &struct{}{} }, func(*struct{}) (kernel.Codec, error) {
		return nil, errorString("picky: needs a schema: set option schema")
	}).Build(nil, "svc.yaml")
	if want := `kernrpc: svc.yaml: codec "picky": needs a schema: set option schema`; err == nil || err.Error() != want {
		t.Errorf("New's error reads %v\nwant: %s", err, want)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }
