package auth_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/auth"
)

// A server requiring tokens, over the engine: the good ones reach the
// handler; a wrong token, an expired one, one signed by another key, a
// missing entry and a huge one each get the same Unauthenticated, and the
// handler never runs for them.
func TestOnlyValidTokensReachTheHandler(t *testing.T) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Registry.Options = map[string]any{"namespace": "auth/" + t.Name()}
	cfg.Client.Timeout = kernel.Duration(10 * time.Second)
	cfg.Filters = []kernrpc.FilterConfig{{Name: auth.Name, Side: "server", Options: map[string]any{
		"tokens": []any{staticToken}, "keys": map[string]any{"a": secretA},
	}}}
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	kernrpc.Handle(srv, "Echo.Who", func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		handled.Add(1)
		return wrapperspb.String("welcome"), nil
	})
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	// A client with the filter attaches its token from the environment.
	t.Setenv("AUTH_TEST_CLIENT_TOKEN", staticToken)
	withToken := *cfg
	withToken.Filters = []kernrpc.FilterConfig{{Name: auth.Name, Side: "client", Options: map[string]any{"token_env": "AUTH_TEST_CLIENT_TOKEN"}}}
	cli, err := kernrpc.NewClient(&withToken, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	var resp wrapperspb.StringValue
	if err := cli.Call(t.Context(), "Echo.Who", wrapperspb.String(""), &resp); err != nil || resp.GetValue() != "welcome" {
		t.Fatalf("a client with the filter: %v, %q; want its token accepted", err, resp.GetValue())
	}

	// A client without it sends what each case says.
	bare := *cfg
	bare.Filters = nil
	raw, err := kernrpc.NewClient(&bare, "echo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	now := time.Now()
	good := sign(t, "a", secretA, now.Add(time.Hour))
	call := func(md kernel.Metadata) error {
		ctx := t.Context()
		if md != nil {
			ctx = kernrpc.WithMetadata(ctx, md)
		}
		return raw.Call(ctx, "Echo.Who", wrapperspb.String(""), &wrapperspb.StringValue{})
	}
	if err := call(kernel.Metadata{"authorization": "Bearer " + good}); err != nil {
		t.Fatalf("a signed token: %v", err)
	}
	before := handled.Load()
	var message string
	for _, tc := range []struct {
		name string
		md   kernel.Metadata
	}{
		{"wrong token", kernel.Metadata{"authorization": "Bearer not-the-token"}},
		{"expired token", kernel.Metadata{"authorization": "Bearer " + sign(t, "a", secretA, now.Add(-time.Second))}},
		{"token for another key", kernel.Metadata{"authorization": "Bearer " + sign(t, "b", secretB, now.Add(time.Hour))}},
		{"token signed with another secret", kernel.Metadata{"authorization": "Bearer " + sign(t, "a", secretB, now.Add(time.Hour))}},
		{"missing header", nil},
		// Within the transport's metadata limit (64KiB by default); a
		// larger one never leaves the client (below).
		{"huge header", kernel.Metadata{"authorization": "Bearer " + strings.Repeat("A", 48<<10)}},
	} {
		err := call(tc.md)
		if kernel.CodeOf(err) != kernel.Unauthenticated {
			t.Errorf("%s: err = %v, want Unauthenticated", tc.name, err)
			continue
		}
		if message == "" {
			message = err.Error()
		} else if err.Error() != message {
			t.Errorf("%s: %q; want the same answer as every other rejection, %q", tc.name, err, message)
		}
		t.Logf("%-33s → %v", tc.name, err)
	}
	if err := call(kernel.Metadata{"authorization": "Bearer " + strings.Repeat("A", 256<<10)}); kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Errorf("a 256KiB header: %v; want ResourceExhausted from the client's transport (max_metadata_bytes)", err)
	}
	if n := handled.Load() - before; n != 0 {
		t.Errorf("the handler ran %d times for rejected calls, want 0", n)
	}
}
