package plugintest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// TestRegistryElectorPasses: a memory registry with a correct in-process
// Elector (testElector) passes the Elector checks.
func TestRegistryElectorPasses(t *testing.T) {
	t.Parallel()
	rec := registryRecord(t, t.Name(), registryBroken(func(r *memory.Registry) kernel.Registry {
		return newTestElector(r, electorSound)
	}), 2*time.Second)
	for _, f := range rec.failures {
		t.Errorf("the memory registry with a sound Elector failed %s: %s", f.path, f.msg)
	}
	for _, s := range rec.skips {
		t.Errorf("the memory registry with a sound Elector had %s skipped: %s", s.path, s.msg)
	}
}

// TestRegistryCatchesBrokenElectors: Electors with one defect each.
func TestRegistryCatchesBrokenElectors(t *testing.T) {
	t.Parallel()
	elector := func(d electorDefect) kernel.Factory[kernel.Registry] {
		return registryBroken(func(r *memory.Registry) kernel.Registry { return newTestElector(r, d) })
	}
	registryCatches(t, []registryBrokenCase{
		{
			// Every Campaign wins at once.
			name:   "EveryoneLeads",
			f:      elector(electorEveryoneLeads),
			caught: []string{"Registry/Elector/Exclusive", "Registry/Elector/ResignHandsOver", "Registry/Elector/CampaignHonoursContext"},
			says:   [][2]string{{"Registry/Elector/Exclusive", "two leaders at once; a Campaign must wait while another leads"}},
		},
		{
			// Resign hands over first and closes Lost a moment later: the
			// resigning process leads on beside the new leader.
			name:   "HandsOverBeforeLost",
			f:      elector(electorHandsOverBeforeLost),
			caught: []string{"Registry/Elector/Exclusive", "Registry/Elector/ResignHandsOver"},
			says:   [][2]string{{"Registry/Elector/Exclusive", "while the previous leader's Lost() was still open: two leaders at once"}},
		},
		{
			// Resign hands over but never closes Lost.
			name:   "ResignKeepsLostOpen",
			f:      elector(electorResignKeepsLostOpen),
			caught: []string{"Registry/Elector/Exclusive", "Registry/Elector/ResignHandsOver"},
			says:   [][2]string{{"Registry/Elector/Exclusive", "after a's Resign; Lost must close when leadership ends for any reason"}},
		},
		{
			// Close leaves the registry's leaderships on.
			name:   "CloseKeepsLeadership",
			f:      elector(electorCloseKeepsLeadership),
			caught: []string{"Registry/Elector/CloseEndsLeadership"},
			says:   [][2]string{{"Registry/Elector/CloseEndsLeadership", "after its registry's Close; Lost must close"}},
		},
		{
			// A lost lease hands over without closing the leader's Lost.
			name:   "LeaseLossKeepsLostOpen",
			f:      elector(electorLeaseLossKeepsLostOpen),
			caught: []string{"Registry/Elector/LeaseLost"},
			says:   [][2]string{{"Registry/Elector/LeaseLost", "stopped renewing (AbandonLeases); Lost must close"}},
		},
		{
			// A waiting Campaign ignores its ctx until it leads.
			name:   "CampaignIgnoresContext",
			f:      elector(electorIgnoresContext),
			caught: []string{"Registry/Elector/CampaignHonoursContext"},
			says:   [][2]string{{"Registry/Elector/CampaignHonoursContext", "Campaign must end when its ctx is done"}},
		},
	})
}

type electorDefect int

const (
	electorSound electorDefect = iota
	electorEveryoneLeads
	electorHandsOverBeforeLost
	electorResignKeepsLostOpen
	electorCloseKeepsLeadership
	electorLeaseLossKeepsLostOpen
	electorIgnoresContext
)

// testElections is the election state every testElector shares: the
// subtests' elections have random names, so runs do not meet.
var testElections = struct {
	mu      sync.Mutex
	leader  map[string]*testLeadership
	changed chan struct{} // closed and replaced at every change
}{leader: map[string]*testLeadership{}, changed: make(chan struct{})}

// testElector is a memory registry with an in-process Elector, sound or
// with defect d.
type testElector struct {
	*memory.Registry
	d      electorDefect
	mu     sync.Mutex
	closed bool
	leads  map[*testLeadership]struct{}
}

func newTestElector(r *memory.Registry, d electorDefect) *testElector {
	return &testElector{Registry: r, d: d, leads: map[*testLeadership]struct{}{}}
}

type testLeadership struct {
	e        *testElector
	election string
	lost     chan struct{}
	once     sync.Once
}

func (l *testLeadership) Lost() <-chan struct{} { return l.lost }

func (l *testLeadership) closeLost() { l.once.Do(func() { close(l.lost) }) }

// handOver lets the next campaign win.
func (l *testLeadership) handOver() {
	testElections.mu.Lock()
	defer testElections.mu.Unlock()
	if testElections.leader[l.election] == l {
		delete(testElections.leader, l.election)
		close(testElections.changed)
		testElections.changed = make(chan struct{})
	}
}

// end ends l as its defect has it, for Resign (why "resign"), Close and
// AbandonLeases.
func (l *testLeadership) end(why string) {
	l.e.mu.Lock()
	delete(l.e.leads, l)
	l.e.mu.Unlock()
	switch {
	case l.e.d == electorHandsOverBeforeLost && why == "resign":
		l.handOver()
		time.Sleep(100 * time.Millisecond)
		l.closeLost()
	case l.e.d == electorResignKeepsLostOpen && why == "resign",
		l.e.d == electorLeaseLossKeepsLostOpen && why == "abandon":
		l.handOver()
	default:
		l.closeLost()
		l.handOver()
	}
}

func (l *testLeadership) Resign(context.Context) error {
	l.end("resign")
	return nil
}

func (e *testElector) Campaign(ctx context.Context, election, id string) (kernel.Leadership, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		e.mu.Lock()
		closed := e.closed
		e.mu.Unlock()
		if closed {
			return nil, kernel.ErrClosed
		}
		testElections.mu.Lock()
		if testElections.leader[election] == nil || e.d == electorEveryoneLeads {
			l := &testLeadership{e: e, election: election, lost: make(chan struct{})}
			testElections.leader[election] = l
			testElections.mu.Unlock()
			e.mu.Lock()
			e.leads[l] = struct{}{}
			e.mu.Unlock()
			return l, nil
		}
		changed := testElections.changed
		testElections.mu.Unlock()
		if e.d == electorIgnoresContext {
			<-changed
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

func (e *testElector) endAll(why string) {
	e.mu.Lock()
	var leads []*testLeadership
	for l := range e.leads {
		leads = append(leads, l)
	}
	e.mu.Unlock()
	for _, l := range leads {
		l.end(why)
	}
}

func (e *testElector) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	if e.d != electorCloseKeepsLeadership {
		e.endAll("close")
	}
	return e.Registry.Close()
}

func (e *testElector) AbandonLeases() {
	e.Registry.AbandonLeases()
	e.endAll("abandon")
}
