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
	"github.com/kernrpc/kernrpc/plugintest"
)

const (
	staticToken = "s3cret-static-token"
	secretA     = "0123456789abcdef0123456789abcdef" // 32 bytes
	secretB     = "fedcba9876543210fedcba9876543210"
)

func TestConformance(t *testing.T) {
	plugintest.Filter(t, auth.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"tokens": []any{staticToken}, "token": staticToken},
		Metadata:      kernel.Metadata{"authorization": "Bearer " + staticToken},
		BadOptions:    map[string]any{"keys": map[string]any{"k1": "too short"}},
		BadOptionsKey: "keys",
	})
}

func TestBadOptionsAreNamed(t *testing.T) {
	t.Setenv("AUTH_TEST_EMPTY", "")
	for _, tc := range []struct {
		options map[string]any
		key     string
	}{
		{map[string]any{"metadata_key": ""}, "metadata_key"},
		{map[string]any{"max_token_size": 10}, "max_token_size"},
		{map[string]any{"tokens": []any{""}}, "tokens"},
		{map[string]any{"tokens": []any{"has space"}}, "tokens"},
		{map[string]any{"tokens_env": "AUTH_TEST_UNSET"}, "tokens_env"},
		{map[string]any{"keys": map[string]any{"k.1": secretA}}, "keys"},
		{map[string]any{"keys": map[string]any{"k1": "short"}}, "keys"},
		{map[string]any{"keys_env": "AUTH_TEST_EMPTY"}, "keys_env"},
		{map[string]any{"token": "a", "token_env": "HOME"}, "token_env"},
		{map[string]any{"token": "line\nbreak"}, "token"},
		{map[string]any{"token_env": "AUTH_TEST_UNSET"}, "token_env"},
	} {
		_, err := auth.Factory.Build(tc.options, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), `option "`+tc.key+`"`) {
			t.Errorf("%v: err = %v, want one naming option %q", tc.options, err, tc.key)
		}
		if err != nil && strings.Contains(err.Error(), secretA) {
			t.Errorf("%v: the error shows the secret: %v", tc.options, err)
		}
	}
}

// clock is a settable time source for expiry.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func sign(t *testing.T, id, secret string, exp time.Time) string {
	t.Helper()
	tok, err := auth.Sign(id, []byte(secret), exp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestServerAcceptsOnlyValidTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clk := &clock{t: now}
	o := auth.DefaultOptions()
	o.Tokens = []string{staticToken, "another-static"}
	o.Keys = map[string]string{"a": secretA}
	o.Now = clk.Now
	f, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	valid := sign(t, "a", secretA, now.Add(time.Hour))
	tampered := []byte(valid)
	tampered[len(tampered)-5] ^= 1
	for _, tc := range []struct {
		name  string
		entry string
		ok    bool
	}{
		{"static", "Bearer " + staticToken, true},
		{"second static", "Bearer another-static", true},
		{"scheme in any case", "bearer " + staticToken, true},
		{"signed", "Bearer " + valid, true},
		{"missing", "", false},
		{"no scheme", staticToken, false},
		{"another scheme", "Basic " + staticToken, false},
		{"scheme alone", "Bearer ", false},
		{"wrong static", "Bearer s3cret-static-tokeN", false},
		{"prefix of a static", "Bearer s3cret", false},
		{"static with more", "Bearer " + staticToken + "x", false},
		{"expired", "Bearer " + sign(t, "a", secretA, now), false},
		{"expired long ago", "Bearer " + sign(t, "a", secretA, now.Add(-24*time.Hour)), false},
		{"signed by another key, same id", "Bearer " + sign(t, "a", secretB, now.Add(time.Hour)), false},
		{"signed by an unknown key", "Bearer " + sign(t, "b", secretB, now.Add(time.Hour)), false},
		{"tampered signature", "Bearer " + string(tampered), false},
		{"tampered expiry", "Bearer " + strings.Replace(valid, ".18", ".28", 1), false},
		{"another version", "Bearer v2" + valid[2:], false},
		{"truncated", "Bearer " + valid[:len(valid)-1], false},
		{"huge", "Bearer " + strings.Repeat("x", 64<<10), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			next := func(context.Context, *kernel.CallInfo, any) (any, error) { called = true; return "ok", nil }
			md := kernel.Metadata{}
			if tc.entry != "" {
				md["authorization"] = tc.entry
			}
			info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: md}
			resp, err := f.Invoke(t.Context(), info, "req", next)
			if tc.ok {
				if err != nil || !called || resp != "ok" {
					t.Errorf("got (%v, %v), next called %v; want it let through", resp, err, called)
				}
				return
			}
			if kernel.CodeOf(err) != kernel.Unauthenticated || called {
				t.Errorf("got %v, next called %v; want Unauthenticated, next not called", err, called)
			}
			want := `auth: Echo.Who needs a valid bearer token in request metadata "authorization"`
			if st := kernel.StatusOf(err); st.Message != want {
				t.Errorf("message %q; want the same %q for every rejection", st.Message, want)
			}
		})
	}
	// The clock decides expiry: an hour later the signed token expires.
	clk.Set(now.Add(time.Hour))
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + valid}}
	if _, err := f.Invoke(t.Context(), info, "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }); kernel.CodeOf(err) != kernel.Unauthenticated {
		t.Errorf("at its expiry the token still passed: %v", err)
	}
}

// Rejections are logged at debug level with their reason, and never with
// the token.
func TestRejectionsAreLoggedWithoutTheToken(t *testing.T) {
	var logged strings.Builder
	var mu sync.Mutex
	o := auth.DefaultOptions()
	o.Tokens = []string{staticToken}
	o.Keys = map[string]string{"a": secretA}
	o.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	expired := sign(t, "a", secretA, time.Now().Add(-time.Minute))
	for _, tok := range []string{"wrong-" + staticToken, expired} {
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Peer: "10.0.0.1:5000",
			Metadata: kernel.Metadata{"authorization": "Bearer " + tok}}
		f.Invoke(t.Context(), info, "req", nil)
	}
	out := logged.String()
	for _, secret := range []string{staticToken, expired, expired[strings.LastIndexByte(expired, '.')+1:], secretA} {
		if strings.Contains(out, secret) {
			t.Errorf("the log shows a token or secret %q:\n%s", secret, out)
		}
	}
	for _, want := range []string{"reason=\"unknown token\"", "reason=expired", "peer=10.0.0.1:5000", "method=Echo.Who"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %s:\n%s", want, out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Admit refuses what Invoke refuses, so the server can answer an
// unauthenticated call before it decodes the request.
func TestAdmitRefusesBeforeDecoding(t *testing.T) {
	f, err := auth.Factory.Build(map[string]any{"tokens": []any{"s3cret-token"}}, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a := f.(kernel.Admitter)
	for _, tc := range []struct {
		md   kernel.Metadata
		want kernel.Code
	}{
		{kernel.Metadata{"authorization": "Bearer s3cret-token"}, kernel.OK},
		{kernel.Metadata{"authorization": "Bearer wrong"}, kernel.Unauthenticated},
		{nil, kernel.Unauthenticated},
	} {
		err := a.Admit(context.Background(), &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: tc.md})
		if kernel.CodeOf(err) != tc.want {
			t.Errorf("Admit with %v = %v, want %v", tc.md, err, tc.want)
		}
	}
	if err := a.Admit(context.Background(), &kernel.CallInfo{Side: kernel.ClientSide}); err != nil {
		t.Errorf("Admit on the client side = %v, want nil: the client attaches, it does not check", err)
	}
}

func TestServerWithoutCredentialsFailsClosed(t *testing.T) {
	f, err := auth.New(auth.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer anything"}}
	if _, err := f.Invoke(t.Context(), info, "req", nil); kernel.CodeOf(err) != kernel.Unauthenticated {
		t.Errorf("got %v, want Unauthenticated", err)
	}
}

func TestSecretsFromTheEnvironment(t *testing.T) {
	t.Setenv("AUTH_TEST_TOKENS", "env-one,env-two")
	t.Setenv("AUTH_TEST_KEYS", "e1:"+secretA+", e2:"+secretB)
	t.Setenv("AUTH_TEST_TOKEN", "env-two")
	srv, err := auth.Factory.Build(map[string]any{"tokens_env": "AUTH_TEST_TOKENS", "keys_env": "AUTH_TEST_KEYS"}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := auth.Factory.Build(map[string]any{"token_env": "AUTH_TEST_TOKEN"}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"env-two", sign(t, "e2", secretB, time.Now().Add(time.Minute))} {
		info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + token}}
		if _, err := srv.Invoke(t.Context(), info, "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }); err != nil {
			t.Errorf("a token from the environment was refused: %v", err)
		}
	}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide}
	cli.Invoke(t.Context(), info, "req", func(_ context.Context, got *kernel.CallInfo, _ any) (any, error) { return "ok", nil })
	if got := info.Metadata["authorization"]; got != "Bearer env-two" {
		t.Errorf("the client attached %q, want the token from $AUTH_TEST_TOKEN", got)
	}
}

func TestClientKeepsACallersOwnToken(t *testing.T) {
	f, err := auth.Factory.Build(map[string]any{"token": "configured"}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ClientSide, Metadata: kernel.Metadata{"authorization": "Bearer per-call"}}
	f.Invoke(t.Context(), info, "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil })
	if got := info.Metadata["authorization"]; got != "Bearer per-call" {
		t.Errorf("metadata %q, want the caller's own", got)
	}
}

func TestSignRefusesWeakKeys(t *testing.T) {
	if _, err := auth.Sign("a", []byte("short"), time.Now()); err == nil {
		t.Error("Sign accepted a 5-byte key")
	}
	if _, err := auth.Sign("a.b", []byte(secretA), time.Now()); err == nil {
		t.Error("Sign accepted a key id with a dot")
	}
}

// BenchmarkInvoke is the filter's cost per call: a trivial next, with and
// without the filter, on the server (a static token, a signed one) and on
// the client (attaching one).
func BenchmarkInvoke(b *testing.B) {
	next := func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }
	ctx := context.Background()
	signed, _ := auth.Sign("a", []byte(secretA), time.Now().Add(time.Hour))
	o := auth.DefaultOptions()
	o.Tokens = []string{staticToken, "second", "third"}
	o.Keys = map[string]string{"a": secretA}
	o.Token = staticToken
	f, _ := auth.New(o)
	for _, bc := range []struct {
		name string
		info *kernel.CallInfo
	}{
		{"server/static", &kernel.CallInfo{Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + staticToken}}},
		{"server/signed", &kernel.CallInfo{Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + signed}}},
		{"server/rejected", &kernel.CallInfo{Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer nope"}}},
		{"client", &kernel.CallInfo{Side: kernel.ClientSide, Metadata: kernel.Metadata{}}},
	} {
		b.Run(bc.name+"/without", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				next(ctx, bc.info, "req")
			}
		})
		b.Run(bc.name+"/with", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.info.Side == kernel.ClientSide {
					delete(bc.info.Metadata, "authorization")
				}
				f.Invoke(ctx, bc.info, "req", next)
			}
		})
	}
}

// max_token_size bounds the whole metadata entry, "Bearer <token>": a
// static token too long to arrive within it could never be accepted, so
// the server refuses it when it is built, as the client refuses its own,
// instead of refusing every call that sends it.
func TestStaticTokensThatCannotFitAreRefused(t *testing.T) {
	long := strings.Repeat("t", 60) // "Bearer " + 60 bytes is 67, over 64
	_, err := auth.Factory.Build(map[string]any{"max_token_size": 64, "tokens": []any{long}}, "svc.yaml")
	if err == nil || !strings.Contains(err.Error(), `option "tokens"`) {
		t.Errorf("a 60-byte static token with max_token_size 64: err = %v, want one naming option \"tokens\"", err)
	}
	if _, err := auth.Factory.Build(map[string]any{"max_token_size": 64, "token": long}, "svc.yaml"); err == nil {
		t.Error("the client accepted a token its entry could not carry")
	}
	fits := strings.Repeat("t", 64-len("Bearer "))
	f, err := auth.Factory.Build(map[string]any{"max_token_size": 64, "tokens": []any{fits}}, "svc.yaml")
	if err != nil {
		t.Fatalf("a static token that just fits: %v", err)
	}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer " + fits}}
	if _, err := f.Invoke(t.Context(), info, "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }); err != nil {
		t.Errorf("a static token that just fits was refused: %v", err)
	}
}

// tokens_env is read as keys_env is: spaces around an entry are dropped
// (a token holds none), and a bad entry is named as the environment's,
// not as an entry of tokens, which may be empty.
func TestTokensFromTheEnvironmentAreReadAsKeysAre(t *testing.T) {
	t.Setenv("AUTH_TEST_TOKENS", "env-one, env-two")
	srv, err := auth.Factory.Build(map[string]any{"tokens": []any{"static"}, "tokens_env": "AUTH_TEST_TOKENS"}, "svc.yaml")
	if err != nil {
		t.Fatalf("tokens_env %q: %v", "env-one, env-two", err)
	}
	info := &kernel.CallInfo{Method: "Echo.Who", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": "Bearer env-two"}}
	if _, err := srv.Invoke(t.Context(), info, "req", func(context.Context, *kernel.CallInfo, any) (any, error) { return "ok", nil }); err != nil {
		t.Errorf("the second token of $AUTH_TEST_TOKENS was refused: %v", err)
	}
	t.Setenv("AUTH_TEST_TOKENS", "env-one,,env-two")
	_, err = auth.Factory.Build(map[string]any{"tokens": []any{"static"}, "tokens_env": "AUTH_TEST_TOKENS"}, "svc.yaml")
	if err == nil || !strings.Contains(err.Error(), `option "tokens_env": entry 1 of $AUTH_TEST_TOKENS is empty`) {
		t.Errorf("an empty entry in $AUTH_TEST_TOKENS: err = %v, want one naming tokens_env, the variable and its entry", err)
	}
}

// A bad key read from keys_env (an id that is not a key id, a secret too
// short) is named as the environment's, as a bad tokens_env entry is: not
// as an entry of keys, which the config may not even set.
func TestBadKeysFromTheEnvironmentNameKeysEnv(t *testing.T) {
	for _, entries := range []string{"e1:short", "e.1:" + secretA} {
		t.Setenv("AUTH_TEST_KEYS", entries)
		_, err := auth.Factory.Build(map[string]any{"keys_env": "AUTH_TEST_KEYS"}, "svc.yaml")
		if err == nil || !strings.Contains(err.Error(), `option "keys_env"`) || !strings.Contains(err.Error(), "$AUTH_TEST_KEYS") {
			t.Errorf("$AUTH_TEST_KEYS=%q: err = %v, want one naming option \"keys_env\" and the variable", entries, err)
		}
		if err != nil && strings.Contains(err.Error(), secretA) {
			t.Errorf("$AUTH_TEST_KEYS=%q: the error shows the secret: %v", entries, err)
		}
	}
}
