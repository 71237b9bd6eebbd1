package kernrpc_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/internal/enginetest"
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

// Size panics on an Echo whose text is "panic-size", and knows no other
// size (0: the engine asks Marshal alone).
func (panickyCodec) Size(v any) int {
	if e, ok := v.(*echopb.Echo); ok && e.Text == "panic-size" {
		panic("the codec cannot size this message")
	}
	return 0
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
	logs := enginetest.DefaultLog(t)
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
		{"panic-size", "codec test-panicky panicked sizing: the codec cannot size this message"},
		{"PANICsize", "codec test-panicky panicked sizing: the codec cannot size this message"},
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
	// The side whose codec panicked logs it with the stack: the client
	// sized one request (panic-size) and decoded one answer (PANICdecode's),
	// the server the other three.
	wantCodecPanicLogs(t, logs.String(), map[string]int{"kernrpc.client": 2, "kernrpc.server": 3})
}

// wantCodecPanicLogs checks that each component logged at least as many
// codec panics as want says, each with its stack.
func wantCodecPanicLogs(t *testing.T, logs string, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for line := range strings.Lines(logs) {
		if strings.Contains(line, "codec panicked") && strings.Contains(line, "stack=") {
			for component := range want {
				if strings.Contains(line, "component="+component) {
					got[component]++
				}
			}
		}
	}
	for component, n := range want {
		if got[component] < n {
			t.Errorf("%s logged %d codec panics with their stack, want %d:\n%s", component, got[component], n, logs)
		}
	}
}

// A codec that panics sizing a stream's message (kernel.CodecSizer) costs
// that SendMsg, on either side, as one that panics encoding it does: the
// sender gets Internal naming the codec, not a panic of its own (on the
// client, the caller's goroutine), and the stream goes on.
func TestCodecPanicSizingAStreamMessageCostsThatMessage(t *testing.T) {
	logs := enginetest.DefaultLog(t)
	cfg := testConfig(t)
	cfg.Codec = kernrpc.PluginConfig{Name: "test-panicky"}
	const want = "codec test-panicky panicked sizing: the codec cannot size this message"
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.HandleBidiStream(s, "Echo.Stream", func(_ context.Context, st kernrpc.ServerStreamOf[echopb.Echo, echopb.Echo]) error {
			for {
				m, err := st.Recv()
				if err != nil {
					return nil
				}
				err = st.Send(&echopb.Echo{Text: strings.ReplaceAll(m.Text, "PANIC", "panic-")})
				if err != nil {
					// Told to the client, which checks it.
					err = st.Send(&echopb.Echo{Text: err.Error()})
				}
				if err != nil {
					return err
				}
			}
		})
	})
	cli := newClient(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kernrpc.OpenStream[echopb.Echo, echopb.Echo](ctx, cli, "Echo.Stream")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Send(&echopb.Echo{Text: "panic-size"}); kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), want) {
		t.Fatalf("client Send = %v; want Internal saying %q", err, want)
	}
	if err := st.Send(&echopb.Echo{Text: "PANICsize"}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || !strings.Contains(m.Text, want) {
		t.Fatalf("server Send = %q, %v; want its SendMsg to return Internal saying %q", m.GetText(), err, want)
	}
	if err := st.Send(&echopb.Echo{Text: "fine"}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.Text != "fine" {
		t.Fatalf("the message after: %q, %v; want it echoed", m.GetText(), err)
	}
	wantCodecPanicLogs(t, logs.String(), map[string]int{"kernrpc.client": 1, "kernrpc.server": 1})
}

func init() {
	kernel.RegisterFilter(kernel.Factory[kernel.Filter]{Name: "test-answer-panic-encode", New: func(any) (kernel.Filter, error) {
		return kernel.FilterFunc(func(context.Context, *kernel.CallInfo, any, kernel.Invoker) (any, error) {
			return &echopb.Echo{Text: "panic-encode"}, nil
		}), nil
	}})
}

// A client filter that answers a call itself with a value of its own has
// it copied into the caller's reply through the codec: a codec that
// panics there costs that call too, with Internal, not the caller's
// goroutine.
func TestCodecPanicCopyingAFiltersAnswerCostsThatCall(t *testing.T) {
	cfg := testConfig(t)
	cfg.Codec = kernrpc.PluginConfig{Name: "test-panicky"}
	cfg.Filters = []kernrpc.FilterConfig{{Name: "test-answer-panic-encode", Side: "client"}}
	cli := newClient(t, cfg)
	var resp echopb.Echo
	err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "x"}, &resp)
	if want := "codec test-panicky panicked copying a filter's answer"; kernel.CodeOf(err) != kernel.Internal || !strings.Contains(err.Error(), want) {
		t.Fatalf("a call whose filter's answer the codec panics copying: %v; want Internal saying %q", err, want)
	}
}
