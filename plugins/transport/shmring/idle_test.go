//go:build linux

package shmring

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

var idle12k = flag.Bool("shmring.idle12k", false, "TestIdleClientsCostNoThread attaches 12,000 clients instead of 2,000")

const (
	// maxIdleThreads bounds the OS threads of a process with thousands of
	// idle connections: the runtime's own, GOMAXPROCS and a few in system
	// calls, but none per connection.
	maxIdleThreads = 50
	// idleEnv tells the "idle" helper how many clients to attach.
	idleEnv = "SHMRING_IDLE_CLIENTS"
	// clientsPerHelper keeps each helper well inside a 20,000-descriptor
	// limit: an idle client holds one (its socket).
	clientsPerHelper = 4000
)

// TestIdleClientsCostNoThread attaches thousands of clients to one server,
// each with a server reader waiting in ReadFrame as the engine's does, and
// checks that the waiting costs no OS thread and one descriptor per
// client: when a waiting reader slept in a futex wait, each held a thread,
// and 10,000 idle clients reached the runtime's thread limit and aborted
// the process. The clients live in helper processes, which check the same
// of their side (each client with a reader waiting too).
func TestIdleClientsCostNoThread(t *testing.T) {
	n := 2000
	if *idle12k {
		n = 12000
	}
	baseFDs, baseRSS := fdCount(t), rssKiB(t)
	raiseFDLimit(t, baseFDs+n+512)
	o := testOptions()
	o.RingSize = minRingSize // thousands of segments, each mapped by both sides
	tr := newTransport(t, o)
	ln := listen(t, tr)

	var (
		mu       sync.Mutex
		attached []*conn
		readers  sync.WaitGroup
	)
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for range n + 1 {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return // the listener closed: the test ended early
			}
			s := c.(*conn)
			mu.Lock()
			attached = append(attached, s)
			mu.Unlock()
			readers.Add(1)
			go func() {
				defer readers.Done()
				echoFrames(s) // ReadFrame(context.Background()) in a loop, as the engine's reader
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-accepting
		mu.Lock()
		defer mu.Unlock()
		for _, s := range attached {
			s.Close()
		}
		readers.Wait()
	})

	var helpers []*helper
	for left := n; left > 0; left -= clientsPerHelper {
		k := min(left, clientsPerHelper)
		helpers = append(helpers, startHelper(t, "idle", ln.Addr(), nil, idleEnv+"="+strconv.Itoa(k)))
	}
	for i, h := range helpers {
		threads, err := strconv.Atoi(h.expectWithin(t, "ATTACHED", 5*time.Minute))
		if err != nil {
			t.Fatalf("helper %d: %v", i, err)
		}
		t.Logf("helper %d: its clients, each with a reader waiting: %d OS threads", i, threads)
		if threads >= maxIdleThreads {
			t.Errorf("helper %d: its idle clients, each with a reader waiting, hold %d OS threads, want fewer than %d", i, threads, maxIdleThreads)
		}
	}
	// The caller, in this process: its client end costs this process
	// another socket.
	caller, err := tr.Dial(timeout(t, time.Minute), ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close()
	select {
	case <-accepting:
	case <-time.After(time.Minute):
		t.Fatal("the listener did not hand out every attached client within a minute")
	}
	if len(attached) != n+1 {
		t.Fatalf("%d of %d clients accepted", len(attached), n+1)
	}

	// Every server reader has declared that it sleeps; give those that
	// would block a thread the time to do so.
	deadline := time.Now().Add(time.Minute)
	for _, s := range attached {
		for s.in.r.reader.Load() != sleeping {
			if time.Now().After(deadline) {
				t.Fatal("the server readers did not all go to sleep within a minute")
			}
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	threads, fds, rss := threadCount(t), fdCount(t), rssKiB(t)
	t.Logf("%d idle clients, each with a server reader waiting: %d OS threads, %d descriptors (%d before), RSS %d MiB (+%.1f KiB per client)",
		n, threads, fds, baseFDs, rss>>10, float64(rss-baseRSS)/float64(n))
	if threads >= maxIdleThreads {
		t.Fatalf("%d idle clients hold %d OS threads, want fewer than %d: waiting for a frame must not hold a thread", n, threads, maxIdleThreads)
	}
	// One per client, the socket; the caller's two ends; a little slack
	// for the runtime and the helpers' pipes.
	if want := baseFDs + n + 2 + 16; fds > want {
		t.Errorf("%d idle clients hold %d descriptors, %d before: want at most %d, one per client", n, fds, baseFDs, want)
	}

	// And the server still serves.
	send(t, caller, &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: 42, Method: "Echo.Echo"}, []byte("still there"))
	f := recv(t, caller)
	if f.CallID != 42 || string(f.Payload) != "still there" {
		t.Fatalf("answer: call %d %q, want call 42 %q", f.CallID, f.Payload, "still there")
	}
	f.Release()
	if threads := threadCount(t); threads >= maxIdleThreads {
		t.Fatalf("after one call, %d OS threads", threads)
	}
}

// helperIdle attaches the clients idleEnv asks for, each with a reader
// waiting as the engine's client reader does, and prints ATTACHED and
// its thread count once they all sleep.
func helperIdle(addr string) error {
	n, err := strconv.Atoi(os.Getenv(idleEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", idleEnv, err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	o := helperOptions()
	o.RingSize = minRingSize
	tr, err := New(o)
	if err != nil {
		return err
	}
	conns := make([]*conn, n)
	const dialers = 4
	errs := make(chan error, dialers)
	var wg sync.WaitGroup
	for d := range dialers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := d; i < n; i += dialers {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				c, err := tr.Dial(ctx, addr)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				conns[i] = c.(*conn)
				go func() {
					for {
						f, err := c.ReadFrame(context.Background())
						if err != nil {
							return
						}
						f.Release()
					}
				}()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	for _, c := range conns {
		for c.in.r.reader.Load() != sleeping {
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	fmt.Println("ATTACHED", len(tasks))
	return nil
}

// raiseFDLimit raises RLIMIT_NOFILE's soft limit to at least need, or
// skips the test when the hard limit is lower and cannot be raised.
func raiseFDLimit(t *testing.T, need int) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= uint64(need) {
		return
	}
	old := lim
	lim.Cur = uint64(need)
	lim.Max = max(lim.Max, lim.Cur)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("this test needs %d file descriptors (one per attached client), above RLIMIT_NOFILE's hard limit %d, which this process may not raise: %v", need, old.Max, err)
	}
	t.Cleanup(func() {
		// The hard limit stays where it is: lowering it cannot be undone.
		restore := old
		restore.Max = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &restore)
	})
}

func threadCount(t *testing.T) int { return dirLen(t, "/proc/self/task") }

func fdCount(t *testing.T) int { return dirLen(t, "/proc/self/fd") }

func dirLen(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// rssKiB is this process's resident memory, shared memory included.
func rssKiB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatalf("VmRSS: %v", err)
			}
			return kib
		}
	}
	t.Fatal("/proc/self/status has no VmRSS")
	return 0
}
