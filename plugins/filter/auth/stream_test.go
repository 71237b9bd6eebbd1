package auth_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/auth"
)

// nopStream is a stream nobody reads or writes: the auth filter decides
// at the stream's opening, before any message.
type nopStream struct{}

func (nopStream) SendMsg(any) error { return nil }
func (nopStream) RecvMsg(any) error { return nil }

// A stream is let through or refused exactly as a unary call with the
// same metadata is, with the same answer, and a refused one never reaches
// next (the handler).
func TestStreamsAreCheckedAsCallsAre(t *testing.T) {
	o := auth.DefaultOptions()
	o.Tokens = []string{staticToken}
	o.Keys = map[string]string{"a": secretA}
	f, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	sf := f.(kernel.StreamFilter)
	now := time.Now()
	for _, tc := range []struct {
		name  string
		md    kernel.Metadata
		valid bool
	}{
		{"static", kernel.Metadata{"authorization": "Bearer " + staticToken}, true},
		{"signed", kernel.Metadata{"authorization": "Bearer " + sign(t, "a", secretA, now.Add(time.Hour))}, true},
		{"missing", nil, false},
		{"wrong", kernel.Metadata{"authorization": "Bearer nope"}, false},
		{"expired", kernel.Metadata{"authorization": "Bearer " + sign(t, "a", secretA, now.Add(-time.Second))}, false},
		{"another key", kernel.Metadata{"authorization": "Bearer " + sign(t, "b", secretB, now.Add(time.Hour))}, false},
		{"too large", kernel.Metadata{"authorization": "Bearer " + strings.Repeat("x", 8<<10)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := func() *kernel.CallInfo {
				return &kernel.CallInfo{Method: "Echo.Watch", Side: kernel.ServerSide, Peer: "10.0.0.1:5000", Metadata: tc.md.Clone()}
			}
			_, callErr := f.Invoke(t.Context(), info(), "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil })
			ran := false
			streamErr := sf.InvokeStream(t.Context(), info(), nopStream{}, func(context.Context, *kernel.CallInfo, kernel.Stream) error {
				ran = true
				return nil
			})
			if tc.valid {
				if callErr != nil || streamErr != nil || !ran {
					t.Fatalf("call: %v; stream: %v, handler ran %v; want both let through", callErr, streamErr, ran)
				}
				return
			}
			if ran {
				t.Error("the handler ran for a stream without a valid token")
			}
			if kernel.CodeOf(streamErr) != kernel.Unauthenticated {
				t.Errorf("stream: %v, want Unauthenticated", streamErr)
			}
			if streamErr == nil || callErr == nil || streamErr.Error() != callErr.Error() {
				t.Errorf("stream refused with %v, a call with %v: want the same answer", streamErr, callErr)
			}
		})
	}
}

// The next's outcome (the handler's status) is the stream's.
func TestStreamKeepsTheHandlersStatus(t *testing.T) {
	f, err := auth.Factory.Build(map[string]any{"tokens": []any{staticToken}}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := kernel.Errorf(kernel.NotFound, "no such watch")
	info := &kernel.CallInfo{Method: "Echo.Watch", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + staticToken}}
	if got := f.(kernel.StreamFilter).InvokeStream(t.Context(), info, nopStream{}, func(context.Context, *kernel.CallInfo, kernel.Stream) error {
		return want
	}); got != want {
		t.Errorf("InvokeStream = %v, want the handler's %v", got, want)
	}
}

// On the client the token goes with the stream's opening, unless the
// caller set its own; the stream given to next is the caller's.
func TestClientAttachesTheTokenToStreams(t *testing.T) {
	f, err := auth.Factory.Build(map[string]any{"token": "configured"}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sf := f.(kernel.StreamFilter)
	for _, tc := range []struct {
		md   kernel.Metadata
		want string
	}{
		{nil, "Bearer configured"},
		{kernel.Metadata{"trace": "1"}, "Bearer configured"},
		{kernel.Metadata{"authorization": "Bearer per-stream"}, "Bearer per-stream"},
	} {
		info := &kernel.CallInfo{Method: "Echo.Watch", Side: kernel.ClientSide, Metadata: tc.md}
		var opened kernel.Metadata
		var given kernel.Stream
		st := nopStream{}
		if err := sf.InvokeStream(t.Context(), info, st, func(_ context.Context, got *kernel.CallInfo, s kernel.Stream) error {
			opened, given = got.Metadata.Clone(), s
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if opened["authorization"] != tc.want {
			t.Errorf("metadata %v: the stream opened with authorization %q, want %q", tc.md, opened["authorization"], tc.want)
		}
		if given != kernel.Stream(st) {
			t.Errorf("next was given %v, want the caller's stream", given)
		}
	}
}

// A refused stream is logged as a stream, at debug level, with the
// reason and without the token.
func TestStreamRejectionsAreLogged(t *testing.T) {
	var logged strings.Builder
	var mu sync.Mutex
	o := auth.DefaultOptions()
	o.Tokens = []string{staticToken}
	o.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	info := &kernel.CallInfo{Method: "Echo.Watch", Side: kernel.ServerSide, Peer: "10.0.0.1:5000",
		Metadata: kernel.Metadata{"authorization": "Bearer wrong-" + staticToken}}
	_ = f.(kernel.StreamFilter).InvokeStream(t.Context(), info, nopStream{}, nil)
	mu.Lock()
	out := logged.String()
	mu.Unlock()
	for _, want := range []string{`msg="auth: stream rejected"`, "method=Echo.Watch", `reason="unknown token"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, staticToken) {
		t.Errorf("the log shows the token:\n%s", out)
	}
}
