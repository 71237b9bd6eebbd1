package kernrpc_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// panickyCodec is json, except that it panics decoding bytes that hold
// "panic-decode" and encoding an Echo whose text is "panic-encode", as a
// codec with a bug (its own, or its library's) may on some message.
type panickyCodec struct{ kernel.Codec }

func (panickyCodec) Name() string { return "test-panicky" }

func (c panickyCodec) Unmarshal(data []byte, v any) error {
	if bytes.Contains(data, []byte("panic-decode")) {
		panic("the codec cannot take this message")
	}
	return c.Codec.Unmarshal(data, v)
}

func (c panickyCodec) Marshal(buf []byte, v any) ([]byte, error) {
	if e, ok := v.(*echopb.Echo); ok && e.Text == "panic-encode" {
		panic("the codec cannot write this message")
	}
	return c.Codec.Marshal(buf, v)
}

func init() {
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-panicky",
		Doc:  "json, panicking on some messages (kernel tests)",
		New: func(any) (kernel.Codec, error) {
			c, err := kernel.NewCodec("json", nil, "test")
			return panickyCodec{c}, err
		},
	})
}

// A codec that panics costs the call it panicked on, on either side, not
// the process: a request the server's codec panics on decoding, an answer
// it panics on encoding, an answer the client's codec panics on decoding.
// Each such call ends Internal, and the connection serves on.
func TestCodecPanicsCostTheCallNotTheProcess(t *testing.T) {
	cfg := testConfig(t)
	cfg.Codec = kernrpc.PluginConfig{Name: "test-panicky"}
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Answer", func(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			// The answer may hold what the request could not.
			return &echopb.Echo{Text: strings.ReplaceAll(req.Text, "PANIC", "panic-")}, nil
		})
	})
	cli := newClient(t, cfg)
	for _, tc := range []struct{ text, want string }{
		{"panic-decode", "codec test-panicky panicked decoding: the codec cannot take this message"},
		{"PANICencode", "codec test-panicky panicked encoding: the codec cannot write this message"},
		{"PANICdecode", "codec test-panicky panicked decoding: the codec cannot take this message"},
	} {
		var resp echopb.Echo
		err := cli.Call(context.Background(), "Echo.Answer", &echopb.Echo{Text: tc.text}, &resp)
		if kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want Internal saying %q", tc.text, err, tc.want)
		}
		if err := cli.Call(context.Background(), "Echo.Answer", &echopb.Echo{Text: "fine"}, &resp); err != nil || resp.Text != "fine" {
			t.Errorf("the call after %q: %q, %v; want it answered", tc.text, resp.Text, err)
		}
	}
}
