package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// winWatch campaigns on e and, the moment the campaign is won, notes
// whether old's Lost was closed by then: a new leader elected while the
// old one's Lost is still open means two leaders at once.
func winWatch(ctx context.Context, e kernel.Elector, election, id string, old kernel.Leadership) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := e.Campaign(ctx, election, id)
		if err == nil && old != nil {
			select {
			case <-old.Lost():
			default:
				err = errors.New("won while the previous leader's Lost() was still open: two leaders at once")
				l.Resign(context.Background())
			}
		}
		ch <- campaignResult{l, err}
	}()
	return ch
}

// TestResignEndsLeadershipBeforeHandingOver: Resign must close the
// leader's Lost before the next candidate can win; otherwise the resigning
// process's workers (watching Lost) run on beside the new leader's.
func TestResignEndsLeadershipBeforeHandingOver(t *testing.T) {
	srv := Start(t)
	a, b := open(t, srv.Endpoint(), nil), open(t, srv.Endpoint(), nil)
	ctx := ctxFor(t)
	for round := range 5 {
		la, err := a.Campaign(ctx, "e", "a")
		if err != nil {
			t.Fatal(err)
		}
		waitB := winWatch(ctx, b, "e", "b", la)
		time.Sleep(100 * time.Millisecond) // b queues behind a
		if err := la.Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		r := <-waitB
		if r.err != nil {
			t.Fatalf("round %d: b's Campaign: %v", round, r.err)
		}
		if err := r.l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPartitionedLeaderGivesUpBeforeItsLeaseExpires: the leader is cut off
// from etcd (a partition: its process runs on). etcd expires its session's
// lease and elects the next candidate; the old leader must have given up
// (Lost closed) by then, as it cannot know when etcd expires the lease
// otherwise than by counting from its last successful renewal.
func TestPartitionedLeaderGivesUpBeforeItsLeaseExpires(t *testing.T) {
	const ttl = time.Second
	srv := Start(t)
	opts := map[string]any{"ttl": ttl.String()}
	for round := range 3 {
		p := startProxy(t, srv.Endpoint())
		a, b := open(t, p.Addr(), opts), open(t, srv.Endpoint(), opts)
		ctx := ctxFor(t)
		la, err := a.Campaign(ctx, "e", "a")
		if err != nil {
			t.Fatal(err)
		}
		waitB := winWatch(ctx, b, "e", "b", la)
		// Let a renew a few times, at a random point of its cycle.
		time.Sleep(ttl + time.Duration(round)*ttl/7)
		p.Cut()
		select {
		case r := <-waitB:
			if r.err != nil {
				t.Fatalf("round %d: b's Campaign after a was cut off: %v", round, r.err)
			}
			r.l.Resign(ctx)
		case <-time.After(ttl + 8*time.Second):
			t.Fatalf("round %d: b does not lead %s after a was cut off", round, ttl+8*time.Second)
		}
		if !closedWithin(la.Lost(), 2*ttl) {
			t.Fatalf("round %d: a's Lost() open %s after it was cut off", round, 2*ttl)
		}
		a.Close()
		b.Close()
	}
}

// TestCampaignEndsWithItsContextWhileEtcdIsDown: a Campaign waiting in
// line ends when its ctx ends, also while etcd does not answer.
func TestCampaignEndsWithItsContextWhileEtcdIsDown(t *testing.T) {
	srv := Start(t)
	a, b := open(t, srv.Endpoint(), map[string]any{"ttl": "5s"}), open(t, srv.Endpoint(), map[string]any{"ttl": "5s"})
	ctx := ctxFor(t)
	if _, err := a.Campaign(ctx, "e", "a"); err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithCancel(ctx)
	waitB := campaign(bctx, b, "e", "b")
	time.Sleep(200 * time.Millisecond)
	srv.Stop()
	defer srv.StartAgain() // lets whatever still waits on etcd end
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case r := <-waitB:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Campaign whose ctx was cancelled = %v, %v; want context.Canceled", r.l, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Campaign still blocked 5s after its ctx was cancelled, etcd down")
	}
}

// TestCampaignWaitingThroughAWipeLeads: b waits behind a; etcd is wiped
// (its keys, leases and revisions gone). a's Lost closes, nobody leads,
// and b, whose ctx lives on, must lead: it cannot wait for the deletion
// of a predecessor's key that no longer exists.
func TestCampaignWaitingThroughAWipeLeads(t *testing.T) {
	const ttl = 2 * time.Second
	srv := Start(t)
	opts := map[string]any{"ttl": ttl.String()}
	a, b, c := open(t, srv.Endpoint(), opts), open(t, srv.Endpoint(), opts), open(t, srv.Endpoint(), opts)
	ctx := ctxFor(t)
	// Some history, so that the wiped etcd's revisions are behind.
	for i := range 50 {
		if err := c.Register(ctx, instance("filler", "f"), ttl); err != nil {
			t.Fatal(err)
		}
		_ = i
		if err := c.Deregister(ctx, instance("filler", "f")); err != nil {
			t.Fatal(err)
		}
	}
	la, err := a.Campaign(ctx, "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	waitB := campaign(ctx, b, "e", "b")
	time.Sleep(200 * time.Millisecond)
	srv.Wipe()
	if !closedWithin(la.Lost(), 3*ttl) {
		t.Errorf("a's Lost() open %s after etcd was wiped", 3*ttl)
	}
	select {
	case r := <-waitB:
		if r.err != nil {
			t.Fatalf("b's Campaign after the wipe: %v", r.err)
		}
		if leader, err := c.Leader(ctx, "e"); err != nil || leader != "b" {
			t.Errorf("Leader after b's Campaign returned = %q, %v; want b", leader, err)
		}
	case <-time.After(6 * ttl):
		leader, err := c.Leader(ctx, "e")
		t.Fatalf("b does not lead %s after etcd was wiped (Leader = %q, %v)", 6*ttl, leader, err)
	}
}
