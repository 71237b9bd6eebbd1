package bufpool

import "testing"

func TestFreeListKeepsUpToItsLimitLastInFirstOut(t *testing.T) {
	var l FreeList[*int]
	if _, ok := l.Get(); ok {
		t.Fatal("Get on an empty list returned a value")
	}
	l.Put(new(int))
	if _, ok := l.Get(); ok {
		t.Fatal("a list with Limit 0 kept a value")
	}
	l.Limit = 2
	a, b, c := new(int), new(int), new(int)
	l.Put(a)
	l.Put(b)
	l.Put(c) // over the limit: dropped
	for i, want := range []*int{b, a} {
		got, ok := l.Get()
		if !ok || got != want {
			t.Fatalf("Get %d = %p, %v; want %p (last in, first out)", i, got, ok, want)
		}
	}
	if v, ok := l.Get(); ok {
		t.Fatalf("Get after draining returned %p; the value over the limit must not be kept", v)
	}
}

func TestFreeListWarmGetPutAllocatesNothing(t *testing.T) {
	l := FreeList[[]byte]{Limit: 4}
	l.Put(make([]byte, 0, 64))
	if n := testing.AllocsPerRun(100, func() {
		b, _ := l.Get()
		l.Put(b)
	}); n != 0 {
		t.Errorf("warm Get+Put allocated %v times per run, want 0", n)
	}
}
