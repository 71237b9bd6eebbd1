package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kernrpc/kernrpc/kernel"
)

// The example runs servers, clients and the governance filters' timers in
// this process: none of their goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The example's story must stay true: each filter does what it prints.
func TestEveryFilterDoesItsPart(t *testing.T) {
	var out bytes.Buffer
	o, err := run(context.Background(), &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if err := o.check(); err != nil {
		t.Error(err)
	}
}

// A run whose filters did not do their part is a failure, which main
// turns into exit 1, naming each filter; not a story printed with exit 0.
func TestABrokenStoryIsAFailure(t *testing.T) {
	good := outcome{flakyCalls: 200, breakerOpen: true, hedges: 3, slowP99: 30 * time.Millisecond, burstRejected: 10, burstRetryAfter: 10,
		workServed: 100, workShed: 50, panicCode: kernel.Internal, afterPanicCode: kernel.OK, noTokenCode: kernel.Unauthenticated}
	if err := good.check(); err != nil {
		t.Fatalf("a good run: %v", err)
	}
	bad := good
	bad.flakyFailures, bad.breakerOpen, bad.afterPanicCode, bad.noTokenReachedHandler = 5, false, kernel.Unavailable, true
	err := bad.check()
	if err == nil {
		t.Fatal("a run whose retry, breaker, recover and auth failed passed the check")
	}
	for _, want := range []string{"retry:", "breaker:", "recover:", "auth:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the check does not name %q: %v", want, err)
		}
	}
	for _, not := range []string{"hedge:", "token-bucket:", "overload:"} {
		if strings.Contains(err.Error(), not) {
			t.Errorf("the check blames %q, which did its part: %v", not, err)
		}
	}
}
