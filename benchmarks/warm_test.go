package main

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAwaitWarmHeapEnds checks each way the wait for a warm heap ends:
// a quiet process is warm after a span or two, and a failed caller or a
// cancelled context ends the wait before its first span.
func TestAwaitWarmHeapEnds(t *testing.T) {
	if d := timeWarm(context.Background(), make(chan error)); d >= warmLimit {
		t.Errorf("a process allocating nothing waited %s, the whole limit: it never counted as warm", d)
	}

	failed := make(chan error, 1)
	failed <- errors.New("a caller failed")
	if d := timeWarm(context.Background(), failed); d >= warmSpan {
		t.Errorf("with a caller failed the wait took %s, want it to end before the first span (%s)", d, warmSpan)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d := timeWarm(ctx, make(chan error)); d >= warmSpan {
		t.Errorf("with its context cancelled the wait took %s, want it to end before the first span (%s)", d, warmSpan)
	}
}

func timeWarm(ctx context.Context, errs chan error) time.Duration {
	t0 := time.Now()
	awaitWarmHeap(ctx, errs)
	return time.Since(t0)
}
