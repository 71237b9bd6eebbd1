package consultest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A campaign waiting for the lock when its registry closes fails with
// kernel.ErrClosed, not with a context error that says its caller gave
// up: the caller's ctx is live.
func TestCloseEndsAWaitingCampaignWithErrClosed(t *testing.T) {
	_, _, _, b := electA(t)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx(t), "db-primary", "b")
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // b waits in line
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, kernel.ErrClosed) || errors.Is(err, context.Canceled) {
			t.Errorf("Campaign ended by Close: %v; want an error wrapping kernel.ErrClosed, and not context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Campaign still waiting 5s after its registry closed")
	}
}
