package auth_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/filter/auth"
)

// FuzzAdmit feeds the server side arbitrary metadata entries. A token is
// accepted only if it is the static one or one that Sign made with the
// server's key and that has not expired: nothing the fuzzer derives from
// them (a cut, a changed character, another spelling of the signature or
// the expiry) may pass. Every refusal is the same Unauthenticated answer,
// which says nothing of what was wrong.
func FuzzAdmit(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	secret := bytes.Repeat([]byte("k"), auth.MinKeySize)
	good, err := auth.Sign("k1", secret, now.Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	expired, _ := auth.Sign("k1", secret, now.Add(-time.Second))
	stranger, _ := auth.Sign("k2", bytes.Repeat([]byte("s"), auth.MinKeySize), now.Add(time.Hour))
	const static = "static-token"
	o := auth.DefaultOptions()
	o.Tokens = []string{static}
	o.Keys = map[string]string{"k1": string(secret)}
	o.Now = func() time.Time { return now }
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
	flt, err := auth.New(o)
	if err != nil {
		f.Fatal(err)
	}
	admit := flt.(kernel.Admitter)
	refusal := func(entry string) error {
		info := &kernel.CallInfo{Method: "/Echo/Say", Side: kernel.ServerSide, Metadata: kernel.Metadata{"authorization": entry}}
		return admit.Admit(context.Background(), info)
	}
	noToken := refusal("")
	if kernel.CodeOf(noToken) != kernel.Unauthenticated {
		f.Fatalf("a call without a token: %v; want Unauthenticated", noToken)
	}

	for _, seed := range []string{
		"", "Bearer ", "Bearer " + static, "bearer " + static, "Basic " + static,
		"Bearer " + good, "BEARER " + good, "Bearer " + expired, "Bearer " + stranger,
		"Bearer " + good + "=", "Bearer " + strings.Replace(good, "v1.", "v2.", 1),
		"Bearer v1.k1.+1800003600." + good[strings.LastIndexByte(good, '.')+1:],
		"Bearer v1..1.AAAA", "Bearer ...", "Bearer " + strings.Repeat("x", 5000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		err := refusal(entry)
		if err == nil {
			token := entry[len("Bearer "):]
			if token != static && token != good {
				t.Fatalf("accepted %q: neither the static token nor one the server's key signed", entry)
			}
			return
		}
		if err.Error() != noToken.Error() || kernel.CodeOf(err) != kernel.Unauthenticated {
			t.Fatalf("refusal of %q: %v; want the answer every refusal gets: %v", entry, err, noToken)
		}
	})
}
