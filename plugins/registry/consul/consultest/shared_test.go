package consultest_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kernrpc/kernrpc/kernel"
)

// sharedLog records what a WatchShared's fn is given, by key.
type sharedLog struct {
	mu     sync.Mutex
	latest map[string][]byte
	given  map[string]int
}

func newSharedLog() *sharedLog {
	return &sharedLog{latest: map[string][]byte{}, given: map[string]int{}}
}

func (l *sharedLog) fn(key string, value []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latest[key] = value
	l.given[key]++
}

// is reports whether key's latest value is want (nil: removed or never
// given).
func (l *sharedLog) is(key string, want []byte) func() bool {
	return func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		got := l.latest[key]
		return (got == nil) == (want == nil) && string(got) == string(want)
	}
}

func (l *sharedLog) times(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.given[key]
}

// kvValue is what the agent holds at the shared entry key, nil if nothing.
func kvValue(t *testing.T, c *api.Client, key string) []byte {
	t.Helper()
	p, _, err := c.KV().Get("kernrpc/shared/"+key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil {
		return nil
	}
	return p.Value
}

// A shared entry is a record of its writer, its expiry and its value;
// a value another program wrote under the prefix is left out, and does
// not stop the watch.
func TestSharedEntriesAreRecordsAndForeignValuesAreLeftOut(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), nil)
	c := apiClient(t, s.Addr())
	if _, err := c.KV().Put(&api.KVPair{Key: "kernrpc/shared/t/foreign", Value: []byte("not a record")}, nil); err != nil {
		t.Fatal(err)
	}
	l := newSharedLog()
	if err := r.WatchShared(ctx(t), "t/", l.fn); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := r.PutShared(ctx(t), "t/k", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the watch gives the put", l.is("t/k", []byte("v")))
	var rec struct {
		Writer  string `json:"writer"`
		Expires int64  `json:"expires"`
		Value   []byte `json:"value"`
	}
	stored := kvValue(t, c, "t/k")
	if err := json.Unmarshal(stored, &rec); err != nil {
		t.Fatalf("stored value %q: %v; want a JSON record", stored, err)
	}
	expires := time.UnixMilli(rec.Expires)
	if rec.Writer == "" || string(rec.Value) != "v" || expires.Before(before.Add(time.Minute-time.Second)) || expires.After(time.Now().Add(time.Minute)) {
		t.Errorf("stored record %s; want a writer, value \"v\" and an expiry a minute after the put", stored)
	}
	if n := l.times("t/foreign"); n != 0 {
		t.Errorf("the foreign value was given %d times; want none", n)
	}
}

// Close deletes the entries the registry was the last to write, and
// leaves one that another registry wrote since.
func TestCloseDeletesOnlyTheEntriesItWroteLast(t *testing.T) {
	s := standIn(t, fast)
	a, b := open(t, s.Addr(), nil), open(t, s.Addr(), nil)
	c := apiClient(t, s.Addr())
	for _, key := range []string{"mine", "theirs"} {
		if err := a.PutShared(ctx(t), key, []byte("a"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.PutShared(ctx(t), "theirs", []byte("b"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if v := kvValue(t, c, "mine"); v != nil {
		t.Errorf("after Close, the entry it wrote is still there: %s", v)
	}
	if v := kvValue(t, c, "theirs"); v == nil {
		t.Error("after Close, the entry another registry wrote since is gone; want it kept")
	}
}

// Puts still in flight when Close begins neither race its deletion of
// what the registry wrote (under -race, a put landing while Close went
// through its keys was a concurrent map write and iteration) nor fail
// anything but themselves.
func TestPutsRacingCloseAreSafe(t *testing.T) {
	s := standIn(t, fast)
	for range 5 {
		r := open(t, s.Addr(), nil)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for j := 0; ; j++ {
					key := "race/" + strconv.Itoa(i) + "/" + strconv.Itoa(j%4)
					if err := r.PutShared(ctx(t), key, []byte("v"), time.Minute); err != nil {
						if !errors.Is(err, kernel.ErrClosed) {
							t.Errorf("a put racing Close failed with %v; want kernel.ErrClosed once closed", err)
						}
						return
					}
				}
			})
		}
		time.Sleep(20 * time.Millisecond)
		if err := r.Close(); err != nil {
			t.Errorf("Close with puts in flight: %v", err)
		}
		wg.Wait()
	}
}

// An entry whose writer died expires at its time, for a watcher that saw
// it and for one that starts after, and a watcher deletes it from the
// agent, so that nothing a dead process wrote stays behind.
func TestADeadWritersEntriesExpireAndAreDeleted(t *testing.T) {
	s := standIn(t, fast)
	writer, reader := open(t, s.Addr(), nil), open(t, s.Addr(), nil)
	c := apiClient(t, s.Addr())
	l := newSharedLog()
	if err := reader.WatchShared(ctx(t), "t/", l.fn); err != nil {
		t.Fatal(err)
	}
	if err := writer.PutShared(ctx(t), "t/k", []byte("v"), 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the watch gives the put", l.is("t/k", []byte("v")))
	writer.AbandonLeases()
	if err := writer.PutShared(ctx(t), "t/k2", []byte("v"), time.Minute); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Errorf("PutShared after AbandonLeases: %v; want it refused, as a dead process writes nothing", err)
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	if kvValue(t, c, "t/k") == nil {
		t.Fatal("an abandoned registry's Close deleted its entry; as a dead process's, it must stay until it expires")
	}
	took := eventually(t, 2*time.Second, "the entry given as removed once expired", l.is("t/k", nil))
	eventually(t, 2*time.Second, "the expired entry deleted from the agent", func() bool { return kvValue(t, c, "t/k") == nil })
	t.Logf("removal given %s after Close", took)

	// One written with a past expiry (a writer whose clock is ahead is
	// alike) is never given, and is deleted.
	if _, err := c.KV().Put(&api.KVPair{Key: "kernrpc/shared/t/old", Value: []byte(`{"writer":"w","expires":1,"value":"dg=="}`)}, nil); err != nil {
		t.Fatal(err)
	}
	late := newSharedLog()
	if err := reader.WatchShared(ctx(t), "t/", late.fn); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the stale entry deleted", func() bool { return kvValue(t, c, "t/old") == nil })
	if n := late.times("t/old") + l.times("t/old"); n != 0 {
		t.Errorf("an expired entry was given %d times; want none", n)
	}
}

// With the agent gone for a while, the watch keeps trying; when it is
// back, every entry is given again, and one deleted meanwhile is given as
// removed.
func TestSharedWatchGivesEverythingAgainAfterTheAgentReturns(t *testing.T) {
	s := standIn(t, fast)
	writer := open(t, s.Addr(), nil)
	reader := open(t, s.Addr(), map[string]any{"wait_time": "500ms"})
	for _, key := range []string{"t/kept", "t/gone"} {
		if err := writer.PutShared(ctx(t), key, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	l := newSharedLog()
	if err := reader.WatchShared(ctx(t), "t/", l.fn); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	time.Sleep(time.Second) // the watch's query fails and backs off
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := writer.DeleteShared(ctx(t), "t/gone"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the deleted entry given as removed", l.is("t/gone", nil))
	eventually(t, 10*time.Second, "the kept entry given again", func() bool { return l.times("t/kept") >= 2 })
	if !l.is("t/kept", []byte("v"))() {
		t.Error("the kept entry's latest value is not \"v\"")
	}
}

// What a shared store refuses, it refuses with the reason: an empty key,
// a negative ttl, a closed registry.
func TestSharedRefusals(t *testing.T) {
	s := standIn(t, fast)
	r := open(t, s.Addr(), nil)
	for _, tc := range []struct {
		key  string
		ttl  time.Duration
		want string
	}{
		{"", time.Minute, "consul: put shared: empty key"},
		{"b", -time.Second, "consul: put shared b: negative ttl -1s"},
	} {
		if err := r.PutShared(ctx(t), tc.key, []byte("x"), tc.ttl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PutShared(%q, ttl %s): %v; want %q", tc.key, tc.ttl, err, tc.want)
		}
	}
	if err := r.DeleteShared(ctx(t), ""); err == nil || !strings.Contains(err.Error(), "empty key") {
		t.Errorf("DeleteShared(\"\"): %v; want an empty key refused", err)
	}
	r.Close()
	for name, err := range map[string]error{
		"PutShared":    r.PutShared(ctx(t), "k", []byte("v"), 0),
		"DeleteShared": r.DeleteShared(ctx(t), "k"),
		"WatchShared":  r.WatchShared(ctx(t), "k/", func(string, []byte) {}),
	} {
		if !errors.Is(err, kernel.ErrClosed) {
			t.Errorf("%s after Close: %v; want kernel.ErrClosed", name, err)
		}
	}
}
