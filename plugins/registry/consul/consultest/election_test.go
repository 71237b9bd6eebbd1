package consultest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
	"github.com/kernrpc/kernrpc/plugins/registry/consul/consultest"
)

// sessionTTL is the session_ttl of options().
const sessionTTL = time.Second

// electA starts a stand-in with registries a and b on it, a elected in
// "db-primary".
func electA(t *testing.T) (s *consultest.Server, la kernel.Leadership, a, b *consul.Registry) {
	t.Helper()
	s = standIn(t, fast)
	a, b = open(t, s.Addr(), nil), open(t, s.Addr(), nil)
	la, err := a.Campaign(ctx(t), "db-primary", "a")
	if err != nil {
		t.Fatal(err)
	}
	return s, la, a, b
}

// campaignAsync campaigns for db-primary as id on a goroutine, and sends
// the leadership won (nil if the campaign failed, which fails t).
func campaignAsync(t *testing.T, r *consul.Registry, id string) chan kernel.Leadership {
	won := make(chan kernel.Leadership, 1)
	go func() {
		l, err := r.Campaign(ctx(t), "db-primary", id)
		if err != nil {
			t.Errorf("%s's campaign: %v", id, err)
		}
		won <- l
	}()
	return won
}

// Campaign elects one leader; a leader that resigns hands over at once,
// and a leader whose process dies is replaced within session_ttl.
func TestElection(t *testing.T) {
	s, la, a, b := electA(t)
	won := campaignAsync(t, b, "b")
	select {
	case <-won:
		t.Fatal("b was elected while a leads")
	case <-time.After(2 * sessionTTL): // a renews its session meanwhile
	}
	select {
	case <-la.Lost():
		t.Fatal("a lost its leadership while alive")
	default:
	}

	t.Run("a leader that dies is replaced within session_ttl", func(t *testing.T) {
		start := time.Now()
		a.AbandonLeases()
		select {
		case lb := <-won:
			took := time.Since(start)
			t.Logf("b elected %s after a stopped renewing (session_ttl %s)", took, sessionTTL)
			if took > sessionTTL+500*time.Millisecond {
				t.Errorf("failover took %s; want within session_ttl (%s)", took, sessionTTL)
			}
			won <- lb
		case <-time.After(sessionTTL + 2*time.Second):
			t.Fatal("b was not elected after a's process died")
		}
	})
	lb := <-won
	if lb == nil {
		t.FailNow()
	}
	t.Run("resign hands over at once and closes Lost", func(t *testing.T) {
		c := open(t, s.Addr(), nil)
		elected := campaignAsync(t, c, "c")
		time.Sleep(100 * time.Millisecond)
		if err := lb.Resign(ctx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lb.Lost():
		default:
			t.Error("Lost is open after Resign")
		}
		select {
		case lc := <-elected:
			if lc == nil {
				t.FailNow()
			}
			// A session that ends under the leader ends its leadership.
			cl := apiClient(t, s.Addr())
			pair, _, _ := cl.KV().Get("kernrpc/elections/db-primary", nil)
			if pair == nil || string(pair.Value) != "c" {
				t.Fatalf("election key = %+v; want held with value c", pair)
			}
			cl.Session().Destroy(pair.Session, nil)
			select {
			case <-lc.Lost():
			case <-time.After(2 * time.Second):
				t.Error("Lost stayed open after the leader's session was destroyed")
			}
		case <-time.After(2 * time.Second):
			t.Fatal("c was not elected within 2s of b's resignation")
		}
	})
	t.Run("a campaign ends with its ctx", func(t *testing.T) {
		d := open(t, s.Addr(), nil)
		e := open(t, s.Addr(), nil)
		if _, err := d.Campaign(ctx(t), "other", "d"); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
		defer cancel()
		_, err := e.Campaign(cctx, "other", "e")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Campaign past its deadline: %v; want DeadlineExceeded", err)
		}
	})
}

// When the agent goes away, the leader gives up before its session could
// expire at the agent (Consul ends it session_ttl after its last renewal,
// and another campaign may win then), and a campaign waiting for the lock
// fails naming the agent. Once the agent is back, the old session expires
// and a new campaign wins.
func TestElectionWithoutTheAgent(t *testing.T) {
	s, la, _, b := electA(t)
	waiting := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx(t), "db-primary", "b")
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond) // b in its blocking query
	s.Stop()
	stopped := time.Now()
	select {
	case <-la.Lost():
		took := time.Since(stopped)
		t.Logf("the leader gave up %s after the agent stopped (session_ttl %s)", took, sessionTTL)
		if took > sessionTTL+500*time.Millisecond {
			t.Errorf("the leader gave up %s after the agent went; want within session_ttl (%s)", took, sessionTTL)
		}
	case <-time.After(sessionTTL + 5*time.Second):
		t.Fatal("the leader kept its leadership with no agent to renew its session")
	}
	select {
	case err := <-waiting:
		if err == nil || !strings.Contains(err.Error(), `consul: campaign "db-primary" as "b": agent `+s.Addr()) {
			t.Errorf("a campaign whose agent went away: %v; want an error naming the campaign and the agent", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a campaign whose agent went away neither won nor failed")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	lc, err := open(t, s.Addr(), nil).Campaign(ctx(t), "db-primary", "c")
	if err != nil {
		t.Fatalf("a campaign once the agent is back: %v", err)
	}
	if err := lc.Resign(ctx(t)); err != nil {
		t.Errorf("Resign: %v", err)
	}
}

// Campaign refuses what no agent is asked about: a bad election name, an
// empty id, a context already done.
func TestCampaignRefusals(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), nil)
	done, cancel := context.WithCancel(ctx(t))
	cancel()
	for _, tc := range []struct {
		name, election, id string
		ctx                context.Context
		want               string
	}{
		{"empty election", "", "a", ctx(t), "the election name must be non-empty and not start with '/'"},
		{"election starting with /", "/db", "a", ctx(t), "the election name must be non-empty and not start with '/'"},
		{"empty id", "db", "", ctx(t), "empty id"},
		{"context done", "db", "a", done, "context canceled"},
	} {
		_, err := r.Campaign(tc.ctx, tc.election, tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Campaign with %s: %v; want %q", tc.name, err, tc.want)
		}
	}
	if n := s.Requests("PUT /v1/session/create"); n != 0 {
		t.Errorf("%d sessions asked of the agent for refused campaigns, want 0", n)
	}
}

// A lock released by the invalidation of a session of another client,
// with a lock-delay of its own (Consul's default is 15s), is refused to
// every acquire until the delay ends, while the key shows no holder. A
// campaign then waits with a growing pause, as Consul's own lock does,
// rather than asking the agent again every few milliseconds; and it wins
// soon after the delay ends.
func TestCampaignWaitsOutAForeignLockDelay(t *testing.T) {
	const delay = 1500 * time.Millisecond
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	foreign, _, err := c.Session().Create(&api.SessionEntry{Name: "another tool", LockDelay: delay}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: "kernrpc/elections/db-primary", Value: []byte("other"), Session: foreign}, nil); err != nil || !ok {
		t.Fatalf("the foreign acquire: %v, %v", ok, err)
	}
	if _, err := c.Session().Destroy(foreign, nil); err != nil {
		t.Fatal(err)
	}
	invalidated := time.Now()
	before := s.Requests("PUT /v1/kv")
	l, err := open(t, s.Addr(), nil).Campaign(ctx(t), "db-primary", "a")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(invalidated)
	acquires := s.Requests("PUT /v1/kv") - before
	t.Logf("won %s after the foreign session ended (lock-delay %s), in %d acquires", took.Round(time.Millisecond), delay, acquires)
	if took < delay {
		t.Errorf("won %s after the foreign session ended, within its lock-delay %s", took, delay)
	}
	if took > delay+time.Second {
		t.Errorf("won %s after the foreign session ended; want within a second of its lock-delay (%s)", took, delay)
	}
	if acquires > 15 {
		t.Errorf("%d acquires while a lock-delay of %s ran; want a few, not one every few milliseconds", acquires, delay)
	}
	if err := l.Resign(ctx(t)); err != nil {
		t.Errorf("Resign: %v", err)
	}
}
