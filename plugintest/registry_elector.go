package plugintest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// elector runs the kernel.Elector checks when the registry implements it,
// and skips them, saying why, when it does not. Registries built from the
// same Options campaign in one election (named per subtest, at random):
//
//   - Elector/Exclusive: of two campaigns, one leads and the other waits,
//     through longer than TTL and Tolerance (the leader's session is
//     renewed meanwhile: its Lost stays open); the waiting one leads once
//     the first resigns, and not before the first one's Lost is closed.
//   - Elector/ResignHandsOver: with two candidates waiting behind a
//     leader, Resign closes the leader's Lost and exactly one of them leads
//     within Tolerance; when it resigns in turn, the other leads.
//   - Elector/CloseEndsLeadership: closing the leader's registry closes
//     its Lost within Tolerance, and the waiting candidate then leads
//     within TTL+Tolerance, not before that Lost closed.
//   - Elector/LeaseLost: where the registry implements
//     kernel.LeaseAbandoner, a leader that stops renewing (a process that
//     died, or cannot reach its backend) sees its Lost close within
//     TTL+Tolerance, and the waiting candidate leads within TTL+Tolerance,
//     not before that Lost closed.
//   - Elector/CampaignHonoursContext: a Campaign with a done ctx fails; a
//     Campaign waiting behind a leader returns an error (ctx's) within
//     Tolerance of its deadline passing and of its ctx being cancelled;
//     and those campaigns leave no candidate behind: once the leader
//     resigns, a new campaign leads within Tolerance.
//
// Give the registry's Options a session or lease TTL near RegistryConfig.TTL
// (etcd's ttl, consul's session_ttl): a leader that dies is replaced
// within it.
func (s registryRun) elector(t tb) {
	probe := s.open(t)
	if _, ok := probe.(kernel.Elector); !ok {
		t.Skipf("the registry does not implement kernel.Elector; no leader election is checked")
	}
	t.Run("Exclusive", s.electorExclusive)
	t.Run("ResignHandsOver", s.electorResignHandsOver)
	t.Run("CloseEndsLeadership", s.electorCloseEnds)
	t.Run("LeaseLost", s.electorLeaseLost)
	t.Run("CampaignHonoursContext", s.electorContext)
}

func (s registryRun) openElector(t tb) kernel.Elector {
	t.Helper()
	return s.open(t).(kernel.Elector)
}

// electorResult is a Campaign's outcome: prevOpen tells that, when it was
// won, the Lost of the leadership it was to follow was still open.
type electorResult struct {
	id       string
	l        kernel.Leadership
	err      error
	prevOpen bool
}

// electorCampaign campaigns on e as id; when it wins, it notes whether
// prev (the leadership that must have ended first; nil for none) had
// closed its Lost. A leadership t did not take is resigned when t ends.
func electorCampaign(t tb, ctx context.Context, e kernel.Elector, election, id string, prev func() kernel.Leadership) <-chan electorResult {
	ch := make(chan electorResult, 1)
	go func() {
		l, err := e.Campaign(ctx, election, id)
		r := electorResult{id: id, l: l, err: err}
		if err == nil && prev != nil {
			if p := prev(); p != nil {
				select {
				case <-p.Lost():
				default:
					r.prevOpen = true
				}
			}
		}
		ch <- r
	}()
	return ch
}

func electorLead(t tb, e kernel.Elector, election, id string, d time.Duration) kernel.Leadership {
	t.Helper()
	ctx, cancel := context.WithTimeout(registryContext(t), d)
	defer cancel()
	l, err := e.Campaign(ctx, election, id)
	if err != nil {
		t.Fatalf("Campaign(%s, %s) of an election nobody leads: %v; want it led within %s", election, id, err, d)
	}
	if l == nil {
		t.Fatalf("Campaign(%s, %s) returned a nil Leadership and no error", election, id)
	}
	t.Cleanup(func() { l.Resign(context.Background()) })
	return l
}

// electorWon waits up to d for ch's campaign to win, failing t if it does
// not, fails, or won while the leadership it followed was still on.
func electorWon(t tb, ch <-chan electorResult, d time.Duration, when string) kernel.Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s's Campaign %s: %v; want it to lead", r.id, when, r.err)
		}
		if r.l == nil {
			t.Fatalf("%s's Campaign %s returned a nil Leadership and no error", r.id, when)
		}
		t.Cleanup(func() { r.l.Resign(context.Background()) })
		if r.prevOpen {
			t.Errorf("%s's Campaign won %s while the previous leader's Lost() was still open: two leaders at once; a leadership must close Lost before another campaign can win (Resign closes it first, and a leader that cannot renew gives up before its lease can expire)", r.id, when)
		}
		return r.l
	case <-time.After(d):
		t.Fatalf("%s: a waiting Campaign does not lead within %s", when, d)
	}
	return nil
}

// electorWaits fails t if ch's campaign returns within d.
func electorWaits(t tb, ch <-chan electorResult, d time.Duration, when string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			r.l.Resign(context.Background())
			t.Fatalf("%s's Campaign won %s: two leaders at once; a Campaign must wait while another leads", r.id, when)
		}
		t.Fatalf("%s's Campaign failed %s: %v; want it to wait while another leads", r.id, when, r.err)
	case <-time.After(d):
	}
}

func electorLostWithin(t tb, l kernel.Leadership, d time.Duration, what string) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(d):
		t.Fatalf("Lost() still open %s after %s; Lost must close when leadership ends for any reason", d, what)
	}
}

func (s registryRun) electorExclusive(t tb) {
	a, b := s.openElector(t), s.openElector(t)
	election, tol := registryService(t), s.cfg.tolerance()
	la := electorLead(t, a, election, "a", tol)
	waitB := electorCampaign(t, registryContext(t), b, election, "b", func() kernel.Leadership { return la })
	electorWaits(t, waitB, max(s.cfg.ttl(), tol)+s.cfg.ttl()/2, "while a leads (its session renewed meanwhile)")
	select {
	case <-la.Lost():
		t.Fatalf("a's Lost() closed while a lived, within %s of its Campaign; a leader's registry must keep its leadership alive", max(s.cfg.ttl(), tol))
	default:
	}
	if err := la.Resign(registryContext(t)); err != nil {
		t.Errorf("a's Resign: %v; want nil", err)
	}
	electorLostWithin(t, la, tol, "a's Resign")
	electorWon(t, waitB, tol, "after a resigned")
}

func (s registryRun) electorResignHandsOver(t tb) {
	a, b, c := s.openElector(t), s.openElector(t), s.openElector(t)
	election, tol := registryService(t), s.cfg.tolerance()
	la := electorLead(t, a, election, "a", tol)
	var (
		mu    sync.Mutex
		first kernel.Leadership // the first of b and c to lead
	)
	// Each of b and c follows a, or the other if the other led first.
	follows := func() kernel.Leadership {
		mu.Lock()
		defer mu.Unlock()
		if first != nil {
			return first
		}
		return la
	}
	results := make(chan electorResult, 2)
	ctx := registryContext(t)
	relay := func(ch <-chan electorResult) {
		go func() { results <- <-ch }()
	}
	relay(electorCampaign(t, ctx, b, election, "b", follows))
	relay(electorCampaign(t, ctx, c, election, "c", follows))
	electorWaits(t, results, tol/2, "while a leads")
	if err := la.Resign(ctx); err != nil {
		t.Errorf("a's Resign: %v; want nil", err)
	}
	electorLostWithin(t, la, tol, "a's Resign")
	won := electorWon(t, results, tol, "after a resigned")
	mu.Lock()
	first = won
	mu.Unlock()
	electorWaits(t, results, tol/2, "while the first of the two waiting leads after a resigned")
	if err := won.Resign(ctx); err != nil {
		t.Errorf("Resign of the second leader: %v; want nil", err)
	}
	electorLostWithin(t, won, tol, "the second leader's Resign")
	electorWon(t, results, tol, "after the second leader resigned")
}

func (s registryRun) electorCloseEnds(t tb) {
	ar := s.open(t)
	a, b := ar.(kernel.Elector), s.openElector(t)
	election, tol := registryService(t), s.cfg.tolerance()
	la := electorLead(t, a, election, "a", tol)
	waitB := electorCampaign(t, registryContext(t), b, election, "b", func() kernel.Leadership { return la })
	electorWaits(t, waitB, tol/2, "while a leads")
	closed := make(chan error, 1)
	go func() { closed <- ar.Close() }()
	electorLostWithin(t, la, tol, "its registry's Close")
	electorWon(t, waitB, s.cfg.ttl()+tol, "after the leader's registry closed")
	select {
	case <-closed:
	case <-time.After(tol):
		t.Errorf("Close of the leader's registry has not returned after %s", tol)
	}
}

func (s registryRun) electorLeaseLost(t tb) {
	ar := s.open(t)
	ab, ok := ar.(kernel.LeaseAbandoner)
	if !ok {
		t.Skipf("the registry does not implement kernel.LeaseAbandoner; a leader that stops renewing cannot be played")
	}
	a, b := ar.(kernel.Elector), s.openElector(t)
	election, tol := registryService(t), s.cfg.tolerance()
	la := electorLead(t, a, election, "a", tol)
	waitB := electorCampaign(t, registryContext(t), b, election, "b", func() kernel.Leadership { return la })
	electorWaits(t, waitB, tol/2, "while a leads")
	ab.AbandonLeases()
	electorLostWithin(t, la, s.cfg.ttl()+tol, "its registry stopped renewing (AbandonLeases)")
	electorWon(t, waitB, s.cfg.ttl()+tol, "after the leader's registry stopped renewing (AbandonLeases)")
}

func (s registryRun) electorContext(t tb) {
	a, b, c := s.openElector(t), s.openElector(t), s.openElector(t)
	election, tol := registryService(t), s.cfg.tolerance()
	done, cancel := context.WithCancel(registryContext(t))
	cancel()
	if l, err := b.Campaign(done, election, "b"); err == nil {
		l.Resign(context.Background())
		t.Fatalf("Campaign with a done ctx led; want ctx's error")
	}
	la := electorLead(t, a, election, "a", tol)
	check := func(r electorResult, want error, after string) {
		t.Helper()
		if r.err == nil {
			r.l.Resign(context.Background())
			t.Errorf("%s's Campaign behind a leader, %s, led: two leaders at once", r.id, after)
		} else if !errors.Is(r.err, want) {
			t.Errorf("%s's Campaign behind a leader, %s: %v; want an error wrapping %v", r.id, after, r.err, want)
		}
	}
	short, cancelShort := context.WithTimeout(registryContext(t), tol/4)
	defer cancelShort()
	select {
	case r := <-electorCampaign(t, short, b, election, "b", nil):
		check(r, context.DeadlineExceeded, "its ctx's deadline passed")
	case <-time.After(tol/4 + tol):
		t.Fatalf("a Campaign waiting behind a leader has not returned %s after its ctx's deadline passed; Campaign must end when its ctx is done", tol)
	}
	cctx, cancelC := context.WithCancel(registryContext(t))
	waitC := electorCampaign(t, cctx, c, election, "c", nil)
	time.Sleep(tol / 4)
	cancelC()
	select {
	case r := <-waitC:
		check(r, context.Canceled, "its ctx cancelled")
	case <-time.After(tol):
		t.Fatalf("a Campaign waiting behind a leader has not returned %s after its ctx was cancelled; Campaign must end when its ctx is done", tol)
	}
	if err := la.Resign(registryContext(t)); err != nil {
		t.Errorf("a's Resign: %v; want nil", err)
	}
	electorLead(t, c, election, "c", 2*tol)
}
