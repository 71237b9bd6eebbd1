package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestStatusOf(t *testing.T) {
	cases := []struct {
		err  error
		want Code
	}{
		{nil, OK},
		{Errorf(NotFound, "x"), NotFound},
		{fmt.Errorf("wrapped: %w", Errorf(PermissionDenied, "y")), PermissionDenied},
		{context.DeadlineExceeded, DeadlineExceeded},
		{fmt.Errorf("op: %w", context.Canceled), Canceled},
		{errors.New("plain"), Unknown},
		// An error is never OK: the engine answers it Unknown.
		{&Status{Code: OK, Message: "an error that says OK"}, Unknown},
		{fmt.Errorf("wrapped: %w", &Status{Code: OK}), Unknown},
	}
	for _, tc := range cases {
		if got := CodeOf(tc.err); got != tc.want {
			t.Errorf("CodeOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestStatusIsMatchesOnCode(t *testing.T) {
	err := fmt.Errorf("call: %w", Errorf(Unavailable, "server gone"))
	if !errors.Is(err, &Status{Code: Unavailable}) {
		t.Error("errors.Is does not match on the code alone")
	}
	if errors.Is(err, &Status{Code: Internal}) {
		t.Error("errors.Is matched a different code")
	}
	if IsRetryable(err) {
		t.Error("a plain Unavailable must not be retryable")
	}
	if !IsRetryable(&Status{Code: Unavailable, Retryable: true}) {
		t.Error("a retryable status is not reported retryable")
	}
}

// A nil *Status, as a target or wrapped in the chain, must not panic
// errors.Is: a caller checking for "any status" may well write it so.
func TestStatusIsNilStatus(t *testing.T) {
	var none *Status
	if errors.Is(Errorf(NotFound, "x"), none) {
		t.Error("a nil *Status target matched a NotFound")
	}
	if errors.Is(fmt.Errorf("w: %w", error(none)), &Status{Code: OK}) {
		t.Error("a wrapped nil *Status matched OK")
	}
}

func TestCodeString(t *testing.T) {
	if Unauthenticated.String() != "Unauthenticated" || Code(99).String() != "Code(99)" {
		t.Errorf("got %q and %q", Unauthenticated.String(), Code(99).String())
	}
}

func TestCodesDecodeFromConfigByName(t *testing.T) {
	var opts struct {
		Code Code `json:"code"`
	}
	for c := OK; c <= Unauthenticated; c++ {
		if err := DecodeOptions(map[string]any{"code": c.String()}, &opts); err != nil || opts.Code != c {
			t.Errorf("decoding %q: got %v, %v; want %v", c.String(), opts.Code, err, c)
		}
	}
	err := DecodeOptions(map[string]any{"code": "Denied"}, &opts)
	if err == nil || !strings.Contains(err.Error(), `"Denied" is not a status code`) || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("decoding an unknown name: err = %v, want one naming it and listing the codes", err)
	}
	if key := OptionKey(err); key != "code" {
		t.Errorf("the error for a bad code names key %q, want \"code\"", key)
	}
	opts.Code = PermissionDenied
	if b, _ := json.Marshal(opts); string(b) != `{"code":"PermissionDenied"}` {
		t.Errorf("defaults list as %s, want the code by name", b)
	}
}

// A nil *Status returned as an error (a handler's `var st *Status; return
// nil, st`) is a non-nil error carrying no code: StatusOf makes it
// Unknown, as any other error, instead of returning a nil *Status whose
// Code panics in every caller (the server's answer path took the process
// down).
func TestStatusOfANilStatusError(t *testing.T) {
	var none *Status
	for _, err := range []error{none, fmt.Errorf("w: %w", error(none))} {
		_ = err.Error() // must not panic
		st := StatusOf(err)
		if st == nil || st.Code != Unknown {
			t.Fatalf("StatusOf(%T %v) = %v; want an Unknown status", err, err, st)
		}
		if c := CodeOf(err); c != Unknown {
			t.Errorf("CodeOf = %v; want Unknown", c)
		}
		if IsRetryable(err) {
			t.Error("a nil *Status reads retryable")
		}
	}
}
