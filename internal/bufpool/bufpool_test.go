package bufpool

import (
	"testing"
)

func same(a, b []byte) bool { return &a[:1][0] == &b[:1][0] }

func TestGetSizeClasses(t *testing.T) {
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	for _, tc := range []struct{ size, cap int }{
		{-1, MinSize},
		{0, MinSize},
		{1, MinSize},
		{MinSize, MinSize},
		{MinSize + 1, 2 * MinSize},
		{4096, 4096},
		{4097, 8192},
		{1 << 16, 1 << 16},
		{1<<16 + 1, 1<<16 + 1}, // above the largest class: exactly what was asked
	} {
		b := p.Get(tc.size)
		if len(b) != 0 || cap(b) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len 0 cap %d", tc.size, len(b), cap(b), tc.cap)
		}
	}
}

func TestPutReuses(t *testing.T) {
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	b := p.Get(3000)
	p.Put(append(b, "dirty"...))
	got := p.Get(2049)
	if !same(got, b) || len(got) != 0 {
		t.Fatalf("Get after Put: got a different or non-empty buffer (len %d)", len(got))
	}
	// A buffer of odd capacity serves the largest class it covers.
	odd := make([]byte, 0, 1500)
	p.Put(odd)
	if got := p.Get(2 * MinSize); !same(got, odd) {
		t.Fatal("a 1500-byte buffer was not reused for a 1024-byte request")
	}
	if got := p.Get(1500); same(got, odd) {
		t.Fatal("a buffer was handed out twice")
	}
}

func TestPutDropsOutOfRange(t *testing.T) {
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	big := p.Get(1<<16 + 1)
	p.Put(big)
	if got := p.Get(1 << 16); same(got, big) {
		t.Fatal("a buffer above MaxSize was kept")
	}
	small := make([]byte, 0, MinSize-1)
	p.Put(small)
	if got := p.Get(1); same(got, small) {
		t.Fatal("a buffer below MinSize was kept")
	}
	p.Put(nil) // nothing to keep; must not panic
}

func TestClassLimits(t *testing.T) {
	// Class k keeps ClassBudget/size buffers, bounded by [MinPerClass, MaxPerClass]:
	// 8 KiB / 512 B = 16 capped to 4; 8 KiB / 4 KiB = 2; 8 KiB / 16 KiB = 0 raised to 1.
	p := New(Limits{MaxSize: 1 << 14, ClassBudget: 8 << 10, MinPerClass: 1, MaxPerClass: 4})
	for _, tc := range []struct{ size, keep int }{{MinSize, 4}, {4096, 2}, {1 << 14, 1}} {
		bufs := make([][]byte, tc.keep+1)
		for i := range bufs {
			bufs[i] = make([]byte, 0, tc.size)
		}
		for _, b := range bufs {
			p.Put(b)
		}
		kept := 0
		for range bufs {
			got := p.Get(tc.size)
			for _, b := range bufs {
				if same(got, b) {
					kept++
				}
			}
		}
		if kept != tc.keep {
			t.Errorf("class %d B kept %d of %d buffers, want %d", tc.size, kept, len(bufs), tc.keep)
		}
	}
}

func TestWarmGetPutAllocatesNothing(t *testing.T) {
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	p.Put(p.Get(4096))
	if n := testing.AllocsPerRun(100, func() { p.Put(p.Get(4096)) }); n != 0 {
		t.Fatalf("warm Get+Put: %v allocations, want 0", n)
	}
}

func TestNewRejectsBadLimits(t *testing.T) {
	for _, l := range []Limits{
		{MaxSize: 1000, MaxPerClass: 1},
		{MaxSize: MinSize / 2, MaxPerClass: 1},
		{MaxSize: MinSize, MinPerClass: 2, MaxPerClass: 1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", l)
				}
			}()
			New(l)
		}()
	}
}
