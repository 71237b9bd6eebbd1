package headerstamp_test

import (
	"context"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/examples/headerstamp"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, headerstamp.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"value": "hello"},
		BadOptions:    map[string]any{"value": ""},
		BadOptionsKey: "value",
	})
}

// A misspelt option fails when the config is loaded; a value New refuses
// fails when the client is built. Both errors name the file, the filter
// and the option.
func TestConfigErrors(t *testing.T) {
	load := func(options string) (*kernrpc.Config, error) {
		return kernrpc.ParseConfig([]byte("filters: [{name: header-stamp, side: client, options: "+options+"}]"), "svc.yaml")
	}
	_, err := load(`{vaule: hello}`)
	if want := `kernrpc: svc.yaml: filter "header-stamp": option "vaule": unknown key (known keys: key, value)`; err == nil || err.Error() != want {
		t.Errorf("a misspelt option: ParseConfig = %v, want %q", err, want)
	}
	for options, want := range map[string]string{
		`{value: ""}`:             `kernrpc: svc.yaml: filter "header-stamp": option "value": must not be empty`,
		`{key: "", value: hello}`: `kernrpc: svc.yaml: filter "header-stamp": option "key": must not be empty`,
	} {
		cfg, err := load(options)
		if err != nil {
			t.Fatalf("options %s: ParseConfig: %v", options, err)
		}
		cli, err := kernrpc.NewClient(cfg, "echo")
		if err == nil {
			cli.Close()
		}
		if err == nil || err.Error() != want {
			t.Errorf("options %s: NewClient = %v, want %q", options, err, want)
		}
	}
}

const config = `
service: stamped
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: headerstamp-test}}
filters:
  - {name: header-stamp, side: client, options: {key: x-caller, value: billing}}
client: {timeout: 5s}
`

// A real call over the engine: the client's filter stamps the request, and
// the server's handler reads the stamp from the metadata it received.
func TestStampReachesTheHandler(t *testing.T) {
	cfg, err := kernrpc.ParseConfig([]byte(config), "kernrpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		md := kernrpc.IncomingMetadata(ctx)
		return wrapperspb.String(md["x-caller"] + "/" + md["tenant"]), nil
	})
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	cli, err := kernrpc.NewClient(cfg, "stamped")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	if _, ok := kernrpc.FindPlugin[*headerstamp.Filter](cli.Plugins(), headerstamp.Name); !ok {
		t.Errorf("the client did not build %q from its config", headerstamp.Name)
	}

	// The caller's own metadata travels beside the stamp, and the map it
	// attached is left as it was.
	mine := kernel.Metadata{"tenant": "acme"}
	var resp wrapperspb.StringValue
	if err := cli.Call(kernrpc.WithMetadata(t.Context(), mine), "Echo.Who", wrapperspb.String("hi"), &resp); err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetValue(), "billing/acme"; got != want {
		t.Errorf("the handler saw x-caller/tenant = %q, want %q", got, want)
	}
	if _, ok := mine["x-caller"]; ok {
		t.Errorf("the filter wrote its stamp into the caller's metadata map: %v", mine)
	}

	// The stamp comes from the client: one configured without the filter
	// sends none, although the server's config is the same.
	plain := *cfg
	plain.Filters = nil
	bare, err := kernrpc.NewClient(&plain, "stamped")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bare.Close() })
	if err := bare.Call(t.Context(), "Echo.Who", wrapperspb.String("hi"), &resp); err != nil {
		t.Fatal(err)
	}
	if got := resp.GetValue(); got != "/" {
		t.Errorf("a client without the filter: the handler saw %q, want no stamp", got)
	}
}
