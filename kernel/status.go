package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Code is the outcome of a call. The set and the numbering are gRPC's, so
// that gateways and users can map codes across without a table.
type Code uint32

const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
	"Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
	"Unauthenticated",
}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// ParseCode returns the code Code.String spells as name, e.g.
// "PermissionDenied".
func ParseCode(name string) (Code, error) {
	for c, n := range codeNames {
		if n == name {
			return Code(c), nil
		}
	}
	return 0, fmt.Errorf("%q is not a status code; use one of %s", name, strings.Join(codeNames[:], ", "))
}

// UnmarshalJSON lets config options name a code, as in `code:
// PermissionDenied`. A null leaves c as it was (isNull).
func (c *Code) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		return nil
	}
	var name string
	if err := json.Unmarshal(b, &name); err != nil {
		return valueError(reflect.TypeFor[Code](), "status code %s must be a name such as %q", b, PermissionDenied.String())
	}
	code, err := ParseCode(name)
	if err != nil {
		return valueError(reflect.TypeFor[Code](), "%v", err)
	}
	*c = code
	return nil
}

// MarshalText spells the code by name, so that listed defaults read as
// they are written in a config.
func (c Code) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Status is the error a call ends with when it does not succeed. It crosses
// the wire as a code and a message.
type Status struct {
	Code    Code
	Message string
	// Retryable is set when the server guarantees the call was not processed
	// (for example, it arrived after the server began shutting down), so the
	// client may safely send it again elsewhere. The engine sends it only
	// for calls refused before any server filter's Invoke (an Admitter's
	// refusal, a shutdown's): a status a handler or Invoke returns, a
	// downstream call's relayed as it came, goes without it.
	Retryable bool
}

func (s *Status) Error() string {
	if s == nil {
		return "kernrpc: nil *kernel.Status"
	}
	return "kernrpc: " + s.Code.String() + ": " + s.Message
}

// Is makes errors.Is(err, &Status{Code: c}) match on the code alone, or
// on the code and the message when the target has one. A nil *Status, on
// either side, carries no code and matches nothing else.
func (s *Status) Is(target error) bool {
	t, ok := target.(*Status)
	return ok && s != nil && t != nil && t.Code == s.Code && (t.Message == "" || t.Message == s.Message)
}

// Errorf returns a *Status with the given code and a formatted message.
func Errorf(c Code, format string, args ...any) error {
	return &Status{Code: c, Message: fmt.Sprintf(format, args...)}
}

// StatusOf converts any error into a *Status: nil gives nil, a *Status found
// by errors.As is returned as is (a nil one is Unknown), context errors map
// to Canceled and DeadlineExceeded, and anything else is Unknown.
func StatusOf(err error) *Status {
	if err == nil {
		return nil
	}
	var s *Status
	if errors.As(err, &s) {
		if s != nil {
			return s
		}
		// A nil *Status returned as an error carries no code.
		return &Status{Code: Unknown, Message: "nil *kernel.Status returned as an error"}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &Status{Code: DeadlineExceeded, Message: err.Error()}
	case errors.Is(err, context.Canceled):
		return &Status{Code: Canceled, Message: err.Error()}
	}
	return &Status{Code: Unknown, Message: err.Error()}
}

// CodeOf returns the code of err: OK for nil, see StatusOf for the rest.
// An error is never OK: one whose *Status claims OK reads Unknown, the
// code the engine answers it with, so that every observer (a metric, a
// log line, a span) counts the call as the caller got it.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	if c := StatusOf(err).Code; c != OK {
		return c
	}
	return Unknown
}

// IsRetryable reports whether err says the call was never processed.
func IsRetryable(err error) bool {
	var s *Status
	return errors.As(err, &s) && s != nil && s.Retryable
}
