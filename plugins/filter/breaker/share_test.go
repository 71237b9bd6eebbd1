package breaker

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// wallBase is the rig's wall clock at clock 0.
const wallBase = int64(1_700_000_000) * int64(time.Second)

// sharedRig is a rig with share: registry whose sharing publishes into
// its queue, read by the test, as if a SharedStore had been found.
func sharedRig(t *testing.T, opts map[string]any) *rig {
	t.Helper()
	o := map[string]any{"share": "registry", "share_namespace": "ns/1"}
	for k, v := range small {
		o[k] = v
	}
	for k, v := range opts {
		o[k] = v
	}
	r := newRig(t, o)
	r.f.wall = func() int64 { return wallBase + int64(r.clock) }
	r.f.share.active.Store(true)
	return r
}

// peer gives the filter, as the watch would, an opening of another client
// for key k, open until the wall time until.
func (r *rig) peer(k key, until int64, origin string) {
	v, err := json.Marshal(sharedValue{OpenUntil: until, Failures: 12, Calls: 20, Origin: origin})
	if err != nil {
		r.t.Fatal(err)
	}
	r.f.share.received(r.f.share.sharedKey(k), v)
}

// queued takes what the circuits queued for the publisher.
func (r *rig) queued() []shareOp {
	var ops []shareOp
	for {
		select {
		case op := <-r.f.share.out:
			ops = append(ops, op)
		default:
			return ops
		}
	}
}

var keyA = key{method: "Echo.Who", host: hostA}

func TestPeerOpeningAppliesUntilItsTime(t *testing.T) {
	r := sharedRig(t, nil)
	r.clock = time.Second
	r.peer(keyA, r.f.wall()+int64(3*time.Second), "another")
	r.wantState(hostA, Open, "a peer opened it")
	before := r.calls
	err := r.call(hostA, nil)
	if !refused(err) || r.calls != before {
		t.Fatalf("peer-opened breaker: %v, next called %d times; want a refusal and no call", err, r.calls-before)
	}
	for _, want := range []string{"another client sharing its breaker state", "12 of 20 calls failed there", "Echo.Who on " + hostA} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	r.wantState(hostB, Closed, "another host")
	r.clock += 3*time.Second - 1
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("1ns before the peer's open-until time: %v, want a refusal", err)
	}
	r.clock++
	if err := r.call(hostA, nil); err != nil {
		t.Fatalf("at the peer's open-until time: %v, want a probe let through", err)
	}
	r.wantState(hostA, HalfOpen, "the peer's time passed: probing on its own")
	got := readings(t, r.f)
	want(t, got, "breaker_peer_opened_total{Echo.Who,"+hostA+"}", 1)
	want(t, got, "breaker_opened_total{Echo.Who,"+hostA+"}", 1)
	if ops := r.queued(); len(ops) != 0 {
		t.Errorf("a peer's opening was published again: %+v", ops)
	}
}

func TestPeerOpeningExtendsAnOpenCircuit(t *testing.T) {
	r := sharedRig(t, nil)
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	r.wantState(hostA, Open, "4 failures")
	r.peer(keyA, r.f.wall()+int64(8*time.Second), "another")
	r.clock += 5 * time.Second // its own open_duration
	if err := r.call(hostA, nil); !refused(err) {
		t.Fatalf("after its own open_duration, before the peer's later time: %v, want a refusal", err)
	}
	want(t, readings(t, r.f), "breaker_peer_opened_total{Echo.Who,"+hostA+"}", 0)
}

func TestExpiredOwnAndForeignEntriesAreIgnored(t *testing.T) {
	r := sharedRig(t, nil)
	r.clock = 10 * time.Second
	r.peer(keyA, r.f.wall(), "another") // its time is now: expired
	r.wantState(hostA, Closed, "a peer's opening whose time passed")
	r.peer(keyA, r.f.wall()+int64(time.Minute), r.f.share.origin)
	r.wantState(hostA, Closed, "the filter's own opening, given back by the watch")
	// Another scope's key, another namespace's, removals, garbage.
	r.peer(key{host: hostA}, r.f.wall()+int64(time.Minute), "another")
	r.f.share.received("breaker/other/Echo.Who|"+hostA, []byte(`{"open_until_unix_nano":9e18,"origin":"x"}`))
	r.f.share.received(r.f.share.sharedKey(keyA), nil)
	r.f.share.received(r.f.share.sharedKey(keyA), []byte("not json"))
	r.wantState(hostA, Closed, "keys of another scope or namespace, a removal, a value that is not JSON")
	if err := r.call(hostA, nil); err != nil {
		t.Errorf("call: %v", err)
	}
}

func TestOpeningIsPublishedAndClosingDeletes(t *testing.T) {
	r := sharedRig(t, nil)
	r.clock = time.Second
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	ops := r.queued()
	if len(ops) != 1 || ops[0].del || ops[0].key != keyA {
		t.Fatalf("after opening, queued %+v; want one put of %v", ops, keyA)
	}
	v := ops[0].value
	if wantUntil := wallBase + int64(6*time.Second); v.OpenUntil != wantUntil || v.Failures != 4 || v.Calls != 4 || v.Origin != r.f.share.origin {
		t.Errorf("published %+v; want open until %d (opened at 1s for 5s), 4 of 4 failures, origin %q", v, wantUntil, r.f.share.origin)
	}
	if k := r.f.share.sharedKey(keyA); k != "breaker/ns%2F1/Echo.Who|"+hostA {
		t.Errorf("shared key %q", k)
	}
	r.clock += 5 * time.Second
	r.call(hostA, nil)
	r.call(hostA, nil) // two probes succeed
	r.wantState(hostA, Closed, "2 successful probes")
	ops = r.queued()
	if len(ops) != 1 || !ops[0].del || ops[0].key != keyA {
		t.Fatalf("after closing, queued %+v; want one delete of %v", ops, keyA)
	}
	// A failed probe publishes again.
	for range 4 {
		r.call(hostA, errUnavailable)
	}
	r.clock += 5 * time.Second
	r.call(hostA, errUnavailable)
	if ops := r.queued(); len(ops) != 2 || ops[1].del || ops[1].value.Calls != 0 {
		t.Errorf("opening then a failed probe queued %+v; want two puts, the second of 0 calls", ops)
	}
}

func TestKeysEscapeTheirParts(t *testing.T) {
	r := sharedRig(t, nil)
	k := key{method: "a/b|c", host: "[::1]:80|/x%"}
	sk := r.f.share.sharedKey(k)
	if strings.Count(sk, "|") != 1 || strings.Count(sk, "/") != 2 {
		t.Errorf("shared key %q: want the parts escaped (one |, the prefix's two /)", sk)
	}
	if got, ok := r.f.share.parseKey(sk); !ok || got != k {
		t.Errorf("parseKey(%q) = %v, %v; want %v", sk, got, ok, k)
	}
}

func TestPublishingNeverBlocksACall(t *testing.T) {
	r := sharedRig(t, map[string]any{"min_requests": 1, "open_duration": "1ns", "half_open_probes": 1})
	// No publisher runs: the queue fills, and every opening past it is
	// dropped and counted, without waiting.
	for range shareQueue + 10 {
		r.call(hostA, errUnavailable) // opens
		r.clock += 2                  // open_duration over: the next call probes
		r.call(hostA, nil)            // closes
	}
	if d := r.f.share.dropped.Load(); d != 2*(shareQueue+10)-shareQueue {
		t.Errorf("dropped %d; want %d", d, 2*(shareQueue+10)-shareQueue)
	}
	want(t, readings(t, r.f), "breaker_share_dropped_total{}", float64(r.f.share.dropped.Load()))
}

// A registry that cannot share fails no call: the filter says so once,
// naming the registry, and keeps its state local.
func TestRegistryWithoutSharedStoreIsLoggedAndStateStaysLocal(t *testing.T) {
	var logs syncbuf.Buffer
	f := sharingFilter(t, &logs)
	observe(f, "plain", struct{ kernel.Registry }{})
	observe(f, "plain", struct{ kernel.Registry }{})
	out := logs.String()
	if n := strings.Count(out, "cannot share state"); n != 1 {
		t.Fatalf("logged %d times (want 1):\n%s", n, out)
	}
	for _, w := range []string{"level=ERROR", "registry=plain", "kernel.SharedStore", "each client keeps its own breaker state"} {
		if !strings.Contains(out, w) {
			t.Errorf("log %q does not say %q", out, w)
		}
	}
	r := &rig{t: t, f: f}
	f.now = func() int64 { return int64(r.clock) }
	for range 4 {
		if err := r.call(hostA, errUnavailable); err != errUnavailable {
			t.Fatalf("call: %v, want next's error", err)
		}
	}
	r.wantState(hostA, Open, "4 failures, judged locally")
	if f.share.active.Load() {
		t.Error("sharing is active without a SharedStore")
	}
}

// On the server side the filter follows nothing.
func TestServerSideObservesNothing(t *testing.T) {
	var logs bytes.Buffer
	flt, err := Factory.Build(map[string]any{"share": "registry"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	f := flt.(*Filter)
	defer f.Close()
	f.log = slog.New(slog.NewTextHandler(&logs, nil))
	f.ObservePlugins([]kernel.PluginRef{{Kind: kernel.KindRegistry, Name: "plain", Side: kernel.ServerSide, Plugin: struct{ kernel.Registry }{}}})
	if logs.Len() != 0 || f.share.active.Load() {
		t.Errorf("server side: logged %q, active %v; want nothing", logs.String(), f.share.active.Load())
	}
}

// A peer's opening holds this client's breaker no longer than an opening
// of its own would, plus the margin its entry lives past it: a peer whose
// wall clock runs years ahead (a VM booted before NTP set its clock), or
// an entry saying so, must not shut an instance out for years, on an open
// circuit as on a closed one.
func TestPeerOpeningFarInTheFutureIsCapped(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(map[bool]string{false: "closed", true: "already open"}[open], func(t *testing.T) {
			r := sharedRig(t, nil)
			r.clock = time.Second
			if open {
				for range 4 {
					r.call(hostA, errUnavailable)
				}
				r.wantState(hostA, Open, "4 failures")
			}
			r.peer(keyA, r.f.wall()+int64(365*24*time.Hour), "another")
			r.wantState(hostA, Open, "a peer opened it")
			limit := 5*time.Second + shareMargin // open_duration + the entry's margin
			r.clock += limit - 1
			if err := r.call(hostA, nil); !refused(err) {
				t.Fatalf("1ns before open_duration + %s: %v, want a refusal", shareMargin, err)
			}
			r.clock++
			if err := r.call(hostA, nil); err != nil {
				t.Fatalf("open_duration + %s after a peer's opening a year long: %v, want a probe let through", shareMargin, err)
			}
			r.wantState(hostA, HalfOpen, "probing on its own")
		})
	}
}
