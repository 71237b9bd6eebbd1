package main

import (
	"bytes"
	"context"
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
	if o.flakyFailures != 0 {
		t.Errorf("%d Demo.Flaky calls failed; retry should have sent each to a healthy instance", o.flakyFailures)
	}
	if !o.breakerOpen || o.badFlakyCalls > o.flakyCalls/4 {
		t.Errorf("breaker open %v, bad instance got %d of %d calls; want it open and the bad instance left alone", o.breakerOpen, o.badFlakyCalls, o.flakyCalls)
	}
	if o.hedges == 0 || o.slowP99 >= 150*time.Millisecond {
		t.Errorf("%d hedges, slowest call %v; want hedges to answer before the slow instance's 200ms", o.hedges, o.slowP99)
	}
	if o.burstRejected == 0 || o.burstRetryAfter != o.burstRejected {
		t.Errorf("%d burst calls rejected, %d with retry-after; want rejections that say when to retry", o.burstRejected, o.burstRetryAfter)
	}
	// How fast a shed call comes back depends on this machine's load (the
	// engine resends a shed call to the other instances first); the
	// overload package's own test measures it.
	if o.workServed == 0 || o.workShed == 0 {
		t.Errorf("overload served %d and shed %d; want both: the excess shed", o.workServed, o.workShed)
	}
	if o.panicCode != kernel.Internal || o.afterPanicCode != kernel.OK {
		t.Errorf("panic answered %v, the next call %v; want Internal then OK", o.panicCode, o.afterPanicCode)
	}
	if o.noTokenCode != kernel.Unauthenticated || o.noTokenReachedHandler {
		t.Errorf("without a token: %v, handler ran %v; want Unauthenticated before any handler", o.noTokenCode, o.noTokenReachedHandler)
	}
}
