package tokenbucket

import (
	"context"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// A call whose deadline has already passed, in mode backoff, finds the
// bucket full. It must not be told the bucket is over its rate limit, let
// alone to retry after a negative number of milliseconds: mode reject
// admits it, and the full bucket has a token for it now.
func TestBackoffExpiredDeadlineFullBucket(t *testing.T) {
	r := newRig(t, map[string]any{"rate": 100, "burst": 100, "mode": "backoff", "max_wait": "100ms"})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-2*time.Second))
	defer cancel()
	md, err := r.call(ctx, "Echo.Who")
	if kernel.CodeOf(err) == kernel.ResourceExhausted {
		t.Fatalf("a full bucket rejected a call as over its rate limit: %v (%s=%q)", err, RetryAfterKey, md[RetryAfterKey])
	}
	if got := r.f.global.rejected.Load(); got != 0 {
		t.Errorf("token_bucket_rejected_total = %d for a full bucket, want 0", got)
	}
}
