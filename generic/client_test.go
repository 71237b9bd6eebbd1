package generic_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/generic"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
	"github.com/kernrpc/kernrpc/kernel"
)

// sameJSON compares two JSON texts as values.
func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("not JSON: %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got %s, want %s", got, want)
	}
}

const fullNote = `{"text":"hi","count":3,"color":"COLOR_BLUE","meta":{"author":"ann","at":"2026-12-03T10:00:00Z"},"tags":["a","b"]}`

// A JSON request goes to the server as the message its descriptor, found
// through reflection, describes, in each codec that encodes messages
// through protobuf's reflection.
func TestCallJSON(t *testing.T) {
	for _, codec := range []string{"protobuf", "json"} {
		t.Run(codec, func(t *testing.T) {
			g := reflectingClient(t, codec, nil)
			ctx := context.Background()
			got, err := g.CallJSON(ctx, notes+"Echo", []byte(fullNote))
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got, fullNote)
			// lowerCamelCase names and numbers as strings are accepted too;
			// an empty request is the empty message.
			got, err = g.CallJSON(ctx, notes+"Echo", []byte(`{"count":"7","meta":{"author":"bo"}}`))
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got, `{"count":7,"meta":{"author":"bo"}}`)
			if got, err = g.CallJSON(ctx, notes+"Echo", nil); err != nil || string(got) != "{}" {
				t.Errorf("empty request: %s, %v; want {}", got, err)
			}
		})
	}
}

func TestCallJSONErrors(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name, method, json string
		is                 error
		code               kernel.Code
		wants              []string
	}{
		{"unknown field", notes + "Echo", `{"txt":"hi"}`, generic.ErrBadJSON, kernel.OK, []string{`unknown field "txt"`, "kernrpc.reflecttest.v1.Note", notes + "Echo"}},
		{"unknown nested field", notes + "Echo", `{"meta":{"writer":"x"}}`, generic.ErrBadJSON, kernel.OK, []string{`unknown field "writer"`}},
		{"wrong type", notes + "Echo", `{"count":"many"}`, generic.ErrBadJSON, kernel.OK, []string{"count", `"many"`}},
		{"unknown enum value", notes + "Echo", `{"color":"COLOR_GREEN"}`, generic.ErrBadJSON, kernel.OK, []string{"color", "COLOR_GREEN"}},
		{"not JSON", notes + "Echo", `{"text":`, generic.ErrBadJSON, kernel.OK, []string{"unexpected"}},
		{"unknown method", notes + "Nope", `{}`, generic.ErrUnknownMethod, kernel.OK, []string{"has Echo, Split, Join, Chat"}},
		{"unknown service", "kernrpc.reflecttest.v1.Nope.Echo", `{}`, generic.ErrUnknownService, kernel.OK, []string{"known:", "kernrpc.reflecttest.v1.Notes", "Echo"}},
		{"served by name only", "Echo.Echo", `{}`, generic.ErrNotDescribed, kernel.OK, []string{`"Echo.Echo"`}},
		{"unknown method of a service served by name only", "Echo.Nope", `{}`, generic.ErrUnknownMethod, kernel.OK, []string{"service Echo is served by name only"}},
		{"a message, not a service", "kernrpc.reflecttest.v1.Note.Echo", `{}`, generic.ErrUnknownService, kernel.OK, []string{"kernrpc.reflecttest.v1.Note is a message, not a service"}},
		{"an enum, not a service", "kernrpc.reflecttest.v1.Color.Echo", `{}`, generic.ErrUnknownService, kernel.OK, []string{"kernrpc.reflecttest.v1.Color is an enum, not a service"}},
		{"a method, not a service", notes + "Echo.Echo", `{}`, generic.ErrUnknownService, kernel.OK, []string{notes + "Echo is a method, not a service"}},
		{"a streaming method", notes + "Split", `{}`, nil, kernel.OK, []string{"server-streaming", "OpenStream"}},
		{"a status from the handler", notes + "Echo", `{"text":"fail"}`, nil, kernel.NotFound, []string{`no note "fail"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := g.CallJSON(ctx, tc.method, []byte(tc.json))
			if err == nil {
				t.Fatalf("answered %s, want an error", resp)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("%v, want %v", err, tc.is)
			}
			if tc.code != kernel.OK && kernel.CodeOf(err) != tc.code {
				t.Errorf("%v: code %v, want %v", err, kernel.CodeOf(err), tc.code)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
		})
	}
}

// Call takes and returns dynamic messages; a message of another type than
// the method's input is refused before it is sent.
func TestCallWithDynamicMessages(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	md, err := g.Method(ctx, notes+"Echo")
	if err != nil {
		t.Fatal(err)
	}
	req := dynamicpb.NewMessage(md.Input())
	req.Set(md.Input().Fields().ByName("text"), protoreflect.ValueOfString("dyn"))
	resp, err := g.Call(ctx, notes+"Echo", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Get(md.Output().Fields().ByName("text")).String(); got != "dyn" {
		t.Errorf("response text %q, want dyn", got)
	}
	// A generated message of the right type does as well.
	if resp, err = g.Call(ctx, notes+"Echo", &testpb.Note{Text: "gen"}); err != nil || resp.Get(md.Output().Fields().ByName("text")).String() != "gen" {
		t.Errorf("generated request: %v, %v", resp, err)
	}
	meta := dynamicpb.NewMessage(md.Input().Fields().ByName("meta").Message())
	if _, err := g.Call(ctx, notes+"Echo", meta); err == nil || !strings.Contains(err.Error(), "a kernrpc.reflecttest.v1.Note.Meta, want a kernrpc.reflecttest.v1.Note") {
		t.Errorf("a request of another type: %v", err)
	}
	if _, err := g.Call(ctx, notes+"Echo", nil); err == nil {
		t.Error("a nil request was sent")
	}
}

func TestServerStreamJSON(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	var got []string
	err := g.ServerStreamJSON(ctx, notes+"Split", []byte(`{"tags":["x","y","z"]}`), func(b []byte) error {
		got = append(got, string(b))
		return nil
	})
	if err != nil || strings.Join(got, " ") != `{"text":"x"} {"text":"y"} {"text":"z"}` {
		t.Fatalf("Split: %q, %v", got, err)
	}
	// The server's final status, after its messages.
	got = nil
	err = g.ServerStreamJSON(ctx, notes+"Split", []byte(`{"text":"fail","tags":["x"]}`), func(b []byte) error {
		got = append(got, string(b))
		return nil
	})
	if kernel.CodeOf(err) != kernel.FailedPrecondition || len(got) != 1 {
		t.Errorf("a failing stream: %q, %v; want one message then FailedPrecondition", got, err)
	}
	// fn's error abandons the stream and is returned.
	stop := errors.New("enough")
	n := 0
	err = g.ServerStreamJSON(ctx, notes+"Split", []byte(`{"tags":["x","y","z"]}`), func([]byte) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("stopping early: %v after %d messages", err, n)
	}
	if err := g.ServerStreamJSON(ctx, notes+"Split", []byte(`{"tagz":[]}`), func([]byte) error { return nil }); !errors.Is(err, generic.ErrBadJSON) {
		t.Errorf("bad JSON: %v", err)
	}
	if err := g.ServerStreamJSON(ctx, notes+"Echo", []byte(`{}`), func([]byte) error { return nil }); err == nil || !strings.Contains(err.Error(), "not server-streaming") {
		t.Errorf("a unary method as a stream: %v", err)
	}
}

// ServerStream takes a dynamic (or generated) request and hands fn each
// message as a dynamic one; a request of another type is refused before
// anything is sent.
func TestServerStreamDynamic(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	md, err := g.Method(ctx, notes+"Split")
	if err != nil {
		t.Fatal(err)
	}
	tags := md.Input().Fields().ByName("tags")
	req := dynamicpb.NewMessage(md.Input())
	for _, tag := range []string{"p", "q"} {
		req.Mutable(tags).List().Append(protoreflect.ValueOfString(tag))
	}
	text := md.Output().Fields().ByName("text")
	var got []string
	err = g.ServerStream(ctx, notes+"Split", req, func(m *dynamicpb.Message) error {
		got = append(got, m.Get(text).String())
		return nil
	})
	if err != nil || strings.Join(got, " ") != "p q" {
		t.Fatalf("Split of a dynamic request: %q, %v", got, err)
	}
	got = nil
	err = g.ServerStream(ctx, notes+"Split", &testpb.Note{Tags: []string{"r"}}, func(m *dynamicpb.Message) error {
		got = append(got, m.Get(text).String())
		return nil
	})
	if err != nil || strings.Join(got, " ") != "r" {
		t.Errorf("Split of a generated request: %q, %v", got, err)
	}
	called := false
	err = g.ServerStream(ctx, notes+"Split", &testpb.Note_Meta{}, func(*dynamicpb.Message) error { called = true; return nil })
	if err == nil || called || !strings.Contains(err.Error(), "want a kernrpc.reflecttest.v1.Note") {
		t.Errorf("a request of another type: %v (fn called: %v)", err, called)
	}
	if err := g.ServerStream(ctx, notes+"Nope", req, func(*dynamicpb.Message) error { return nil }); !errors.Is(err, generic.ErrUnknownMethod) {
		t.Errorf("an unknown method: %v", err)
	}
}

func TestOpenStream(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	st, err := g.OpenStream(ctx, notes+"Chat")
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"one", "two"} {
		n, err := generic.UnmarshalJSON(st.Method().Input(), []byte(`{"text":"`+text+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(n); err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := generic.MarshalJSON(m); string(b) != `{"text":"re: `+text+`"}` {
			t.Errorf("Chat answered %s", b)
		}
	}
	if err := st.Send(&testpb.Note_Meta{}); err == nil {
		t.Error("sent a message of another type")
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after CloseSend: %v, want io.EOF", err)
	}
	if _, err := g.OpenStream(ctx, notes+"Echo"); err == nil || !strings.Contains(err.Error(), "unary") {
		t.Errorf("OpenStream of a unary method: %v", err)
	}
	if _, err := g.OpenStream(ctx, notes+"Nope"); !errors.Is(err, generic.ErrUnknownMethod) {
		t.Errorf("OpenStream of an unknown method: %v", err)
	}
}

// The reflection source asks for each file once: once a method is known,
// it is found with the server gone.
func TestReflectionSourceKeepsWhatItWasSent(t *testing.T) {
	cfg := config(t, "protobuf", true)
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kernrpc.Handle(srv, notes+"Echo", func(_ context.Context, n *testpb.Note) (*testpb.Note, error) { return n, nil })
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, cfg)
	src := generic.NewReflectionSource(cli)
	ctx := context.Background()
	if _, err := generic.FindMethod(ctx, src, notes+"Echo"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	md, err := generic.FindMethod(ctx, src, notes+"Split")
	if err != nil || md.Input().FullName() != "kernrpc.reflecttest.v1.Note" {
		t.Errorf("with the server gone: %v, %v", md, err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := src.FindDescriptor(short, "kernrpc.reflecttest.v1.Other"); err == nil || errors.Is(err, generic.ErrNotFound) {
		t.Errorf("a name not sent yet, with the server gone: %v, want the call's error", err)
	}
}

func TestReflectionSourceOfAServerWithoutReflection(t *testing.T) {
	cfg := config(t, "protobuf", false)
	serveNotes(t, cfg, nil)
	g := generic.NewClient(newClient(t, cfg), generic.NewReflectionSource(newClient(t, cfg)))
	_, err := g.CallJSON(context.Background(), notes+"Echo", []byte(`{}`))
	if kernel.CodeOf(err) != kernel.Unimplemented || !strings.Contains(err.Error(), "server.reflection: true") {
		t.Fatalf("%v, want Unimplemented saying to turn reflection on", err)
	}
}

func TestReflectionSourceServices(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	svcs, err := g.Source().Services(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]generic.Service{}
	for _, s := range svcs {
		byName[s.Name] = s
	}
	if s := byName["kernrpc.reflecttest.v1.Notes"]; !s.Described || len(s.Methods) != 3 || s.Methods[0].Kind != generic.BidiStreaming || s.Methods[2].Kind != generic.ServerStreaming {
		t.Errorf("Notes: %+v", s)
	}
	if s := byName["Echo"]; s.Described || len(s.Methods) != 1 || s.Methods[0].Input != "" {
		t.Errorf("Echo: %+v, want listed by name only", s)
	}
}

// A nil *dynamicpb.Message, the type Call returns and Recv reads into, is
// refused as a nil message, as an untyped nil is, by every method that
// sends one: not a panic in the caller's goroutine.
func TestATypedNilMessageIsRefused(t *testing.T) {
	g := reflectingClient(t, "protobuf", nil)
	ctx := context.Background()
	var req *dynamicpb.Message
	if _, err := g.Call(ctx, notes+"Echo", req); err == nil || !strings.Contains(err.Error(), "nil message") {
		t.Errorf("Call with a nil *dynamicpb.Message: %v, want a nil message refused", err)
	}
	if err := g.ServerStream(ctx, notes+"Split", req, func(*dynamicpb.Message) error { return nil }); err == nil || !strings.Contains(err.Error(), "nil message") {
		t.Errorf("ServerStream with a nil *dynamicpb.Message: %v, want a nil message refused", err)
	}
	st, err := g.OpenStream(ctx, notes+"Chat")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Send(req); err == nil || !strings.Contains(err.Error(), "nil message") {
		t.Errorf("Send of a nil *dynamicpb.Message: %v, want a nil message refused", err)
	}
}
