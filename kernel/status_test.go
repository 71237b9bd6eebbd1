package kernel

import (
	"context"
	"errors"
	"fmt"
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

func TestCodeString(t *testing.T) {
	if Unauthenticated.String() != "Unauthenticated" || Code(99).String() != "Code(99)" {
		t.Errorf("got %q and %q", Unauthenticated.String(), Code(99).String())
	}
}
