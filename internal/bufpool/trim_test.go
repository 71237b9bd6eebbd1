package bufpool

import (
	"runtime"
	"testing"
	"time"
)

// trimEveryCycle has every GC cycle trim until the test ends.
func trimEveryCycle(t *testing.T) {
	trimmer.mu.Lock()
	d := trimInterval
	trimInterval = 0
	trimmer.mu.Unlock()
	t.Cleanup(func() {
		trimmer.mu.Lock()
		trimInterval = d
		trimmer.mu.Unlock()
	})
}

func held[T any](l *FreeList[T]) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.items)
}

// A list drops at each trim what it did not need since the one before,
// oldest first, and keeps what traffic dipped into.
func TestTrimDropsWhatWasNotNeeded(t *testing.T) {
	l := FreeList[*int]{Limit: 16}
	vals := make([]*int, 8)
	for i := range vals {
		vals[i] = new(int)
		l.Put(vals[i])
	}
	l.trim() // the burst's 8 came after the last trim: all were needed
	if n := held(&l); n != 8 {
		t.Fatalf("first trim after 8 Puts left %d; want 8 (they came since the last trim)", n)
	}
	// Traffic takes 3 out at most, and puts them back.
	a, _ := l.Get()
	b, _ := l.Get()
	c, _ := l.Get()
	l.Put(c)
	l.Put(b)
	l.Put(a)
	l.trim() // held 5 or more throughout: those 5, the oldest, go
	if n := held(&l); n != 3 {
		t.Fatalf("trim after dipping to 5 of 8 left %d; want 3", n)
	}
	for i, want := range []*int{vals[5], vals[6], vals[7]} {
		if l.items[i] != want {
			t.Errorf("item %d is not the one put %d-th; want the newest kept, oldest dropped", i, 5+i)
		}
	}
	l.trim() // untouched since: all go
	if n := held(&l); n != 0 {
		t.Fatalf("trim of an idle list left %d; want 0", n)
	}
	// A list emptied by traffic keeps what is put back before the next trim.
	l.Put(new(int))
	l.Get()
	l.Get() // finds none
	l.Put(new(int))
	l.trim()
	if n := held(&l); n != 1 {
		t.Fatalf("trim after the list ran dry left %d; want 1", n)
	}
}

// Trimming is what makes the free list let go: without it, an idle Pool
// keeps its buffers however many cycles pass.
func TestPoolsAreTrimmedAfterGCCycles(t *testing.T) {
	trimEveryCycle(t)
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	class := &p.classes[len(p.classes)-1]
	for range 8 {
		p.Put(make([]byte, 0, 1<<16))
	}
	deadline := time.Now().Add(10 * time.Second)
	for held(class) > 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond) // cleanups run on a goroutine of their own
	}
	if n := held(class); n != 0 {
		t.Fatalf("an idle pool still holds %d buffers after GC cycles for 10s; want them trimmed", n)
	}
	runtime.KeepAlive(p)
}

// A Pool that is collected leaves the trimmer's list at its next trim, and
// the trimmer stops waiting for cycles once no Pool is left.
func TestCollectedPoolsLeaveTheTrimmer(t *testing.T) {
	trimEveryCycle(t)
	for range 100 {
		New(Limits{MaxSize: 1 << 12, ClassBudget: 1 << 16, MinPerClass: 1, MaxPerClass: 8})
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
		trimmer.mu.Lock()
		n, armed := len(trimmer.pools), trimmer.armed
		trimmer.mu.Unlock()
		if n == 0 && !armed {
			return
		}
	}
	t.Fatal("the trimmer still lists collected pools, or waits for cycles with none left, after 10s")
}

// Trimming costs steady traffic nothing: Get and Put still allocate
// nothing while trims run between them.
func TestTrimmedListsServeWarmTrafficWithoutAllocating(t *testing.T) {
	p := New(Limits{MaxSize: 1 << 16, ClassBudget: 1 << 20, MinPerClass: 1, MaxPerClass: 8})
	p.Put(make([]byte, 0, 4096))
	if n := testing.AllocsPerRun(100, func() {
		b := p.Get(4096)
		p.Put(b)
		p.trim()
	}); n != 0 {
		t.Errorf("warm Get+Put with a trim between allocated %v times per run, want 0", n)
	}
}
