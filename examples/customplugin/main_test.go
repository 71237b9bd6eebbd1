package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// The example runs a server and clients in this process: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The example must run from its embedded config and from the file beside
// it, showing one call passing and one rejected.
func TestExampleRuns(t *testing.T) {
	for _, path := range []string{"", "kernrpc.yaml"} {
		var out bytes.Buffer
		if err := run(path, &out); err != nil {
			t.Fatalf("run(%q): %v", path, err)
		}
		for _, want := range []string{`passed:   "echo for acme: hello"`, `rejected: kernrpc: PermissionDenied: require-metadata: call to Echo.Echo lacks metadata "tenant"`} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("run(%q) printed\n%s\nwant a line with %q", path, out.String(), want)
			}
		}
	}
}

// A config without the filter lets the call through, which the example
// must report instead of exiting 0.
func TestExampleNoticesAMissingFilter(t *testing.T) {
	data, err := os.ReadFile("kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(data)
	i := strings.Index(cfg, "filters:")
	j := strings.Index(cfg, "server:")
	if i < 0 || j < i {
		t.Fatal("kernrpc.yaml has no filters: block before server:")
	}
	p := filepath.Join(t.TempDir(), "nofilter.yaml")
	if err := os.WriteFile(p, []byte(cfg[:i]+"filters: []\n\n"+cfg[j:]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(p, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "did not run") {
		t.Fatalf("run without the filter = %v, want an error saying the filter did not run", err)
	}
}

// The config picks the custom filter by name, and it acts on real calls
// between a server and a client over tcp-lv.
func TestConfigPicksTheFilterByName(t *testing.T) {
	cfg, err := kernrpc.LoadConfig("kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Transport.Name != "tcp-lv" {
		t.Fatalf("kernrpc.yaml uses transport %q; this test is about calls over tcp-lv", cfg.Transport.Name)
	}
	if len(cfg.Filters) != 1 || cfg.Filters[0].Name != "require-metadata" {
		t.Fatalf("kernrpc.yaml filters = %+v, want the require-metadata filter", cfg.Filters)
	}
	cfg.Registry.Options = map[string]any{"namespace": t.Name()} // apart from other tests' servers

	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	kernrpc.Handle(srv, "Echo.Echo", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		handled.Add(1)
		return wrapperspb.String(kernrpc.IncomingMetadata(ctx)["tenant"] + ":" + req.GetValue()), nil
	})
	kernrpc.Handle(srv, "Admin.Ping", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("pong"), nil
	})
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	cli, err := kernrpc.NewClient(cfg, cfg.Service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })

	cases := []struct {
		name   string
		method string
		md     kernel.Metadata
		want   kernel.Code
		reply  string
	}{
		{"with a tenant", "Echo.Echo", kernel.Metadata{"tenant": "acme"}, kernel.OK, "acme:hi"},
		{"without metadata", "Echo.Echo", nil, kernel.PermissionDenied, ""},
		{"with other metadata only", "Echo.Echo", kernel.Metadata{"user": "bob"}, kernel.PermissionDenied, ""},
		{"with an empty tenant", "Echo.Echo", kernel.Metadata{"tenant": ""}, kernel.PermissionDenied, ""},
		{"a method the filter is not scoped to", "Admin.Ping", nil, kernel.OK, "pong"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := handled.Load()
			ctx := t.Context()
			if tc.md != nil {
				ctx = kernrpc.WithMetadata(ctx, tc.md)
			}
			var resp wrapperspb.StringValue
			err := cli.Call(ctx, tc.method, wrapperspb.String("hi"), &resp)
			if got := kernel.CodeOf(err); got != tc.want {
				t.Fatalf("%s: code %s (%v), want %s", tc.method, got, err, tc.want)
			}
			if tc.want != kernel.OK {
				if !strings.Contains(err.Error(), `lacks metadata "tenant"`) {
					t.Errorf("rejection %q does not say which metadata is missing", err)
				}
				if n := handled.Load() - before; n != 0 {
					t.Errorf("a rejected call reached the handler (%d calls)", n)
				}
				return
			}
			if resp.GetValue() != tc.reply {
				t.Errorf("reply %q, want %q", resp.GetValue(), tc.reply)
			}
		})
	}
}
