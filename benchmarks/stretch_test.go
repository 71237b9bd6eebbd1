package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// slowFirstCall is an echo client whose first call takes longer than a
// whole window, as one did on a loaded CI machine.
type slowFirstCall struct {
	echoClient
	delay time.Duration
}

func (s slowFirstCall) newCaller(payload []byte) callFunc {
	call, first := s.echoClient.newCaller(payload), true
	return func(ctx context.Context) (int, error) {
		if first {
			first = false
			time.Sleep(s.delay)
		}
		return call(ctx)
	}
}

// TestAWindowWithoutACallStaysOpenUntilOne: a round whose only caller
// completes nothing within the window still gives a figure, over the time
// the window was really open, and says it was stretched.
func TestAWindowWithoutACallStaysOpenUntilOne(t *testing.T) {
	sys, err := lookupSystems([]string{"netrpc"})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := startServer(ctx, exe, sys[0], "", serveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()

	const window, delay = 50 * time.Millisecond, 300 * time.Millisecond
	slow := *sys[0]
	slow.dial = func(ctx context.Context, addr string) (echoClient, error) {
		c, err := sys[0].dial(ctx, addr)
		return slowFirstCall{c, delay}, err
	}
	o := options{duration: window, warmup: time.Millisecond, rounds: 1, systems: []*system{&slow}}
	c := cell{mode: modeLong, payload: 16, callers: 1}
	rr, err := runRound(ctx, &slow, srv, c, o)
	if err != nil {
		t.Fatalf("runRound: %v", err)
	}
	if !rr.stretched || rr.hist.n == 0 {
		t.Fatalf("stretched %v with %d calls; want a stretched window with calls", rr.stretched, rr.hist.n)
	}
	if rr.elapsed < delay-window {
		t.Errorf("window open %s; the first call alone took %s", rr.elapsed, delay)
	}

	res := &result{}
	res.add(rr)
	b := &benchmark{opts: o, cells: []cell{c}, results: map[cell][]*result{c: {res}}}
	want := "- Stretched windows: no call completed within the window of net/rpc, " + c.String() + " (1 of 1 rounds)"
	if md := b.markdown("go test"); !strings.Contains(md, want) {
		t.Errorf("report lacks %q:\n%s", want, md)
	}

	// A round with calls in its window is not stretched.
	rr, err = runRound(ctx, sys[0], srv, c, o)
	if err != nil || rr.stretched {
		t.Errorf("a round of quick calls: stretched %v, err %v", rr != nil && rr.stretched, err)
	}
}
