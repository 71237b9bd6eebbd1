package kernrpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/codec/flatbuffers"
	_ "github.com/kernrpc/kernrpc/plugins/codec/json"
	_ "github.com/kernrpc/kernrpc/plugins/codec/msgpack"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// Codecs registered for these tests only: one that counts how often it is
// built, one slow to encode, and one that does not build without options.
var countingBuilds atomic.Int32

func init() {
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-counting",
		Doc:  "protobuf, counting how often it is built (kernel tests)",
		New: func(any) (kernel.Codec, error) {
			countingBuilds.Add(1)
			return countingCodec{}, nil
		},
	})
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-slow-aliasing",
		Doc:  "flatbuffers, slow to encode (kernel tests)",
		New: func(any) (kernel.Codec, error) {
			c, err := kernel.NewCodec("flatbuffers", nil, "test")
			return slowAliasing{c}, err
		},
	})
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-slow-in-place",
		Doc:  "protobuf with alias_requests, slow to encode (kernel tests)",
		New: func(any) (kernel.Codec, error) {
			c, err := kernel.NewCodec("protobuf", map[string]any{"alias_requests": true}, "test")
			return slowInPlace{c}, err
		},
	})
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{
		Name: "test-needs-options",
		Doc:  "never builds from its defaults (kernel tests)",
		New: func(any) (kernel.Codec, error) {
			return nil, errors.New("option key: required")
		},
	})
}

type countingCodec struct{ protobuf.Codec }

func (countingCodec) Name() string { return "test-counting" }

var everyCodec = []string{"protobuf", "json", "msgpack", "flatbuffers"}

// echoCodec answers with the request's text and payload and names the codec
// the server decoded it with, so the client sees which one served it.
func echoCodec(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
	return &echopb.Echo{Text: req.Text + " via " + kernrpc.CallInfoFrom(ctx).Codec, Payload: req.Payload}, nil
}

// One server, configured with protobuf, and four clients at once, one per
// codec: each is served in its own codec and answered in it.
func TestOneServerAnswersEachClientInItsOwnCodec(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, func(s *kernrpc.Server) { kernrpc.Handle(s, "Echo.Codec", echoCodec) })

	const calls = 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, codec := range everyCodec {
		ccfg := testConfig(t)
		ccfg.Codec = kernrpc.PluginConfig{Name: codec}
		cli := newClient(t, ccfg)
		wg.Go(func() {
			<-start
			for i := range calls {
				req := &echopb.Echo{Text: fmt.Sprintf("%s call %d", codec, i), Payload: bytes.Repeat([]byte{byte(i)}, i*37)}
				var resp echopb.Echo
				if err := cli.Call(context.Background(), "Echo.Codec", req, &resp); err != nil {
					t.Errorf("%s client, call %d: %v", codec, i, err)
					return
				}
				if want := req.Text + " via " + codec; resp.Text != want || !bytes.Equal(resp.Payload, req.Payload) {
					t.Errorf("%s client, call %d: answer %q with %d payload bytes, want %q with %d", codec, i, resp.Text, len(resp.Payload), want, len(req.Payload))
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// The answer frame itself names the codec of the request, and its payload
// is in that codec.
func TestResponseFrameCarriesTheRequestsCodec(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	c := rawConn(t, srv.Addr())
	for i, name := range everyCodec {
		codec, err := kernel.NewCodec(name, nil, "test")
		if err != nil {
			t.Fatal(err)
		}
		msg := &echopb.Echo{Text: "raw " + name, Payload: []byte{1, 2, 3}}
		payload, err := codec.Marshal(nil, msg)
		if err != nil {
			t.Fatal(err)
		}
		resp := roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: uint64(i + 1),
			Method: "Echo.Echo", Codec: name, Payload: payload})
		var got echopb.Echo
		err = codec.Unmarshal(bytes.Clone(resp.Payload), &got)
		if resp.Code != kernel.OK || resp.Codec != name || err != nil || !proto.Equal(&got, msg) {
			t.Errorf("request in %s: answer %v %q in codec %q decoding to %v (%v); want OK in %s echoing %v",
				name, resp.Code, resp.Message, resp.Codec, &got, err, name, msg)
		}
		resp.Release()
	}
}

func TestUnknownCodecIsInvalidArgumentAndTheConnectionStaysUp(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, nil)
	c := rawConn(t, srv.Addr())
	before := countingBuilds.Load()

	resp := roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Echo.Echo", Codec: "yaml", Payload: []byte("text: hi")})
	if resp.Code != kernel.InvalidArgument || !strings.Contains(resp.Message, `codec "yaml" is not loaded`) ||
		!strings.Contains(resp.Message, "flatbuffers, json, msgpack, protobuf") {
		t.Errorf("unknown codec: %v %q; want InvalidArgument naming yaml and listing the loaded codecs", resp.Code, resp.Message)
	}
	resp.Release()
	if n := countingBuilds.Load(); n != before {
		t.Errorf("an unknown codec name built %d codecs", n-before)
	}

	payload := []byte(`{"text":"still here"}`)
	resp = roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2,
		Method: "Echo.Echo", Codec: "json", Payload: payload})
	defer resp.Release()
	if resp.Code != kernel.OK || resp.Codec != "json" || !strings.Contains(string(resp.Payload), "still here") {
		t.Errorf("the next call on the same connection: %v %q %s; want it answered in json", resp.Code, resp.Message, resp.Payload)
	}
}

// A codec other than the configured one is built once, however many calls
// name it at once.
func TestOtherCodecsAreBuiltOnce(t *testing.T) {
	cfg := testConfig(t)
	startServer(t, cfg, nil)
	ccfg := testConfig(t)
	ccfg.Codec = kernrpc.PluginConfig{Name: "test-counting"}
	ccfg.Client.PoolSize = 4
	cli := newClient(t, ccfg)
	before := countingBuilds.Load() // the client built one

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				var resp echopb.Echo
				if err := cli.Call(context.Background(), "Echo.Echo", &echopb.Echo{Text: "n"}, &resp); err != nil || resp.Text != "n" {
					t.Errorf("goroutine %d call %d: %v %v", g, i, &resp, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := countingBuilds.Load() - before; n != 1 {
		t.Errorf("the server built the requested codec %d times, want once", n)
	}
}

// The configured codec keeps its configured options; another one a request
// names gets its defaults.
func TestConfiguredCodecKeepsItsOptionsOthersTakeDefaults(t *testing.T) {
	cfg := testConfig(t)
	cfg.Codec = kernrpc.PluginConfig{Name: "json", Options: map[string]any{"discard_unknown": true}}
	srv := startServer(t, cfg, nil)
	c := rawConn(t, srv.Addr())
	resp := roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Echo.Echo", Codec: "json", Payload: []byte(`{"text":"a","colour":"red"}`)})
	if resp.Code != kernel.OK {
		t.Errorf("unknown field with the configured discard_unknown: %v %q, want OK", resp.Code, resp.Message)
	}
	resp.Release()

	msgpack, err := kernel.NewCodec("msgpack", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	payload, err := msgpack.Marshal(nil, map[string]any{"Text": "a", "Colour": "red"})
	if err != nil {
		t.Fatal(err)
	}
	resp = roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2,
		Method: "Echo.Echo", Codec: "msgpack", Payload: payload})
	if resp.Code != kernel.InvalidArgument || !strings.Contains(resp.Message, "Colour") {
		t.Errorf("unknown field in msgpack, at its defaults: %v %q, want InvalidArgument naming it", resp.Code, resp.Message)
	}
	resp.Release()

	resp = roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 3,
		Method: "Echo.Echo", Codec: "test-needs-options"})
	if resp.Code != kernel.FailedPrecondition || !strings.Contains(resp.Message, "test-needs-options") {
		t.Errorf("a codec that needs options: %v %q, want FailedPrecondition naming it", resp.Code, resp.Message)
	}
	resp.Release()
}

// slowAliasing is the flatbuffers codec, slow to encode: long enough for
// the connection to read other requests meanwhile, into recycled buffers.
type slowAliasing struct{ kernel.Codec }

func (c slowAliasing) Name() string       { return "test-slow-aliasing" }
func (c slowAliasing) AliasesInput() bool { return true }
func (c slowAliasing) Marshal(dst []byte, v any) ([]byte, error) {
	time.Sleep(2 * time.Millisecond)
	return c.Codec.Marshal(dst, v)
}

// slowInPlace is the protobuf codec with alias_requests on, slow to encode.
type slowInPlace struct{ kernel.Codec }

func (c slowInPlace) Name() string { return "test-slow-in-place" }
func (c slowInPlace) Marshal(dst []byte, v any) ([]byte, error) {
	time.Sleep(2 * time.Millisecond)
	return c.Codec.Marshal(dst, v)
}
func (c slowInPlace) UnmarshalInPlace(data []byte, v any) error {
	return c.Codec.(kernel.InPlaceUnmarshaler).UnmarshalInPlace(data, v)
}

// With a codec whose values read the request in place, a handler may answer
// with the request itself (the echo handler does): the server keeps the
// request's bytes until the answer is encoded, while the connection goes on
// reading other requests into recycled buffers.
func TestAliasedRequestOutlivesTheHandlerUntilEncoded(t *testing.T) {
	for _, codec := range []string{"test-slow-aliasing", "test-slow-in-place"} {
		t.Run(codec, func(t *testing.T) { testAliasedRequestOutlivesTheHandler(t, codec) })
	}
}

func testAliasedRequestOutlivesTheHandler(t *testing.T, codec string) {
	cfg := testConfig(t)
	cfg.Codec = kernrpc.PluginConfig{Name: codec}
	startServer(t, cfg, nil)
	cli := newClient(t, cfg)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				req := &echopb.Echo{Text: fmt.Sprint(g, "/", i), Payload: bytes.Repeat([]byte{byte(g*16 + i)}, 1000)}
				var resp echopb.Echo
				if err := cli.Call(context.Background(), "Echo.Echo", req, &resp); err != nil {
					t.Errorf("caller %d call %d: %v", g, i, err)
					return
				}
				if !proto.Equal(&resp, req) {
					t.Errorf("caller %d call %d: answer %q with payload %x..., want its own request back", g, i, resp.Text, resp.Payload[:min(4, len(resp.Payload))])
					return
				}
			}
		})
	}
	wg.Wait()
}

// A request in a codec the server was not configured with, which that
// codec's library cannot decode into the handler's type, fails that call
// with InvalidArgument: it does not take the server down. (msgpack's
// library panicked decoding its own encoding of a protobuf oneof.)
func TestRequestACodecCannotDecodeIsInvalidArgument(t *testing.T) {
	cfg := testConfig(t)
	srv := startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Value.Echo", func(_ context.Context, req *structpb.Value) (*structpb.Value, error) { return req, nil })
	})
	c := rawConn(t, srv.Addr())
	codec, err := kernel.NewCodec("msgpack", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	payload, err := codec.Marshal(nil, structpb.NewStringValue("a oneof"))
	if err != nil {
		t.Fatal(err)
	}
	resp := roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 1,
		Method: "Value.Echo", Codec: "msgpack", Payload: payload})
	if resp.Code != kernel.InvalidArgument || !strings.Contains(resp.Message, "msgpack") {
		t.Errorf("a oneof in msgpack: %v %q; want InvalidArgument from decoding with msgpack", resp.Code, resp.Message)
	}
	resp.Release()

	payload = []byte(`{"text":"still here"}`)
	resp = roundTripRaw(t, c, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 2,
		Method: "Echo.Echo", Codec: "json", Payload: payload})
	defer resp.Release()
	if resp.Code != kernel.OK || !strings.Contains(string(resp.Payload), "still here") {
		t.Errorf("the next call on the same connection: %v %q %s; want it answered", resp.Code, resp.Message, resp.Payload)
	}
}
