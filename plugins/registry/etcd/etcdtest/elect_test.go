package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

type campaignResult struct {
	l   kernel.Leadership
	err error
}

func campaign(ctx context.Context, e kernel.Elector, election, id string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := e.Campaign(ctx, election, id)
		ch <- campaignResult{l, err}
	}()
	return ch
}

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestLeaderDiesAndIsReplacedWithinTTL: two registries campaign; the first
// wins, the second waits. The first one's process "dies" (AbandonLeases:
// no revoke, no resign): its Leadership is lost, and the second leads
// within the session TTL. Its Resign hands leadership on at once.
func TestLeaderDiesAndIsReplacedWithinTTL(t *testing.T) {
	const ttl = 2 * time.Second
	srv := Start(t)
	opts := map[string]any{"ttl": ttl.String()}
	a, b, c := open(t, srv.Endpoint(), opts), open(t, srv.Endpoint(), opts), open(t, srv.Endpoint(), opts)
	ctx := ctxFor(t)

	la, err := a.Campaign(ctx, "scheduler", "a")
	if err != nil {
		t.Fatalf("first Campaign: %v", err)
	}
	if leader, err := c.Leader(ctx, "scheduler"); err != nil || leader != "a" {
		t.Fatalf("Leader = %q, %v; want a", leader, err)
	}
	waitB := campaign(ctx, b, "scheduler", "b")
	select {
	case r := <-waitB:
		t.Fatalf("b's Campaign returned %v, %v while a leads; want it to wait", r.l, r.err)
	case <-time.After(300 * time.Millisecond):
	}

	a.AbandonLeases()
	died := time.Now()
	if !closedWithin(la.Lost(), time.Second) {
		t.Errorf("a's Lost() still open after AbandonLeases; a dead leader has lost its leadership")
	}
	var lb kernel.Leadership
	select {
	case r := <-waitB:
		if r.err != nil {
			t.Fatalf("b's Campaign: %v", r.err)
		}
		lb = r.l
	case <-time.After(ttl + time.Second): // the lessor's 500ms check, and slack
		t.Fatalf("b does not lead %s after the leader died (ttl %s)", ttl+time.Second, ttl)
	}
	t.Logf("b leads %s after a died (ttl %s)", time.Since(died).Round(time.Millisecond), ttl)
	if leader, err := c.Leader(ctx, "scheduler"); err != nil || leader != "b" {
		t.Errorf("Leader = %q, %v; want b", leader, err)
	}

	// A resignation hands over at once, not after a TTL.
	waitC := campaign(ctx, c, "scheduler", "c")
	time.Sleep(100 * time.Millisecond)
	if err := lb.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if !closedWithin(lb.Lost(), time.Second) {
		t.Errorf("b's Lost() still open after Resign")
	}
	select {
	case r := <-waitC:
		if r.err != nil {
			t.Fatalf("c's Campaign: %v", r.err)
		}
		// Close ends c's leadership: its session is revoked.
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if !closedWithin(r.l.Lost(), time.Second) {
			t.Errorf("c's Lost() still open after its registry closed")
		}
	case <-time.After(time.Second):
		t.Fatalf("c does not lead a second after b resigned")
	}
	if err := lb.Resign(ctx); err != nil {
		t.Errorf("second Resign: %v; want nil", err)
	}
}

// TestCampaignEndsWithItsContext: a Campaign waiting behind a leader ends
// with its ctx, with ctx's error, and leaves no candidate behind.
func TestCampaignEndsWithItsContext(t *testing.T) {
	srv := Start(t)
	a, b := open(t, srv.Endpoint(), nil), open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	la, err := a.Campaign(ctx, "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if l, err := b.Campaign(short, "e", "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign behind a leader with a 200ms deadline = %v, %v; want context.DeadlineExceeded", l, err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if leader, err := a.Leader(ctx, "e"); err != nil || leader != "" {
		t.Errorf("Leader after the only leader resigned and the other candidate gave up = %q, %v; want none", leader, err)
	}
	if _, err := b.Campaign(ctx, "e", "b"); err != nil {
		t.Errorf("Campaign of an election without a leader: %v", err)
	}
}

// TestElectionsWhoseNamesNestAreApart: an election's candidates are the
// keys under its prefix, so election "jobs" must not take in the
// candidates of "jobs/cleanup": with "jobs/cleanup" led, a campaign for
// "jobs" wins at once, and each names its own leader.
func TestElectionsWhoseNamesNestAreApart(t *testing.T) {
	srv := Start(t)
	a, b := open(t, srv.Endpoint(), nil), open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	if _, err := b.Campaign(ctx, "jobs/cleanup", "b"); err != nil {
		t.Fatal(err)
	}
	if leader, err := a.Leader(ctx, "jobs"); err != nil || leader != "" {
		t.Errorf("Leader of jobs while only jobs/cleanup is led = %q, %v; want none", leader, err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := a.Campaign(short, "jobs", "a"); err != nil {
		t.Fatalf("Campaign for jobs while another registry leads jobs/cleanup: %v; want it led at once", err)
	}
	for election, want := range map[string]string{"jobs": "a", "jobs/cleanup": "b", "jobs%2Fcleanup": ""} {
		if leader, err := a.Leader(ctx, election); err != nil || leader != want {
			t.Errorf("Leader of %q = %q, %v; want %q", election, leader, err, want)
		}
	}
}
