//go:build linux

package shmring

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/balancer/roundrobin"
	_ "github.com/kernrpc/kernrpc/plugins/codec/protobuf"
	_ "github.com/kernrpc/kernrpc/plugins/registry/memory"
)

// kernelConfig is a config for the echo service over shm-ring at addr,
// found through a registry namespace of the test's own.
func kernelConfig(tb testing.TB, addr string, options map[string]any) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Address = addr
	cfg.Transport = kernrpc.PluginConfig{Name: Name, Options: options}
	cfg.Registry.Options = map[string]any{"namespace": tb.Name()}
	return cfg
}

// clientConfig reaches the echo server at addr without a shared registry,
// as a client in another process does.
func clientConfig(addr string, options map[string]any) *kernrpc.Config {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "echo"
	cfg.Transport = kernrpc.PluginConfig{Name: Name, Options: options}
	cfg.Registry.Options = map[string]any{"static": map[string]any{"echo": []any{addr}}}
	return cfg
}

func echo(_ context.Context, req *echopb.Echo) (*echopb.Echo, error) { return req, nil }

func startServer(tb testing.TB, cfg *kernrpc.Config, extra func(*kernrpc.Server)) *kernrpc.Server {
	tb.Helper()
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	kernrpc.Handle(srv, "Echo.Echo", echo)
	if extra != nil {
		extra(srv)
	}
	if err := srv.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

func newClient(tb testing.TB, cfg *kernrpc.Config) *kernrpc.Client {
	tb.Helper()
	cli, err := kernrpc.NewClient(cfg, "echo")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// segmentMappings lists this process's mappings of shm-ring segments, as
// address ranges.
func segmentMappings(tb testing.TB) [][2]uintptr {
	tb.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out [][2]uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "/memfd:"+memfdName) {
			continue
		}
		lo, hi, _ := strings.Cut(strings.Fields(line)[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		out = append(out, [2]uintptr{uintptr(a), uintptr(b)})
	}
	return out
}

// inSharedMemory reports whether b lies in a mapped shm-ring segment.
func inSharedMemory(tb testing.TB, b []byte) bool {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, m := range segmentMappings(tb) {
		if p >= m[0] && p < m[1] {
			return true
		}
	}
	return false
}

// waitNoSegments waits (boundedly) until this process maps no segment. A
// test that counts mappings calls it first too: the last user of an
// earlier test's segment may let go of it just after that test ended.
func waitNoSegments(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for n := len(segmentMappings(tb)); n > 0; n = len(segmentMappings(tb)) {
		if time.Now().After(deadline) {
			tb.Fatalf("%d segments still mapped: a dead connection kept its segment", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// devShm lists /dev/shm, where a POSIX shared memory segment would leave
// a name behind.
func devShm(tb testing.TB) []string {
	tb.Helper()
	entries, err := os.ReadDir("/dev/shm")
	if err != nil {
		tb.Skipf("no /dev/shm to check: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func checkDevShm(tb testing.TB, before []string) {
	tb.Helper()
	after := devShm(tb)
	if strings.Join(after, "\n") != strings.Join(before, "\n") {
		tb.Fatalf("/dev/shm changed: before %q, after %q", before, after)
	}
}

// With alias_requests the server's protobuf requests point into the ring
// (or, for a frame larger than a record, into the copy it was assembled
// in) until the answer is encoded.
func TestEchoOverTheKernelIncludingFourTimesTheRing(t *testing.T) {
	for _, alias := range []bool{false, true} {
		t.Run(fmt.Sprint("alias_requests=", alias), func(t *testing.T) {
			cfg := kernelConfig(t, socketIn(t), map[string]any{"ring_size": "64KiB"})
			srvCfg := *cfg
			srvCfg.Codec.Options = map[string]any{"alias_requests": alias}
			startServer(t, &srvCfg, nil)
			echoSizes(t, newClient(t, cfg))
		})
	}
}

func echoSizes(t *testing.T, cli *kernrpc.Client) {
	for _, n := range []int{0, 16, 1000, 64 << 10, 4 * 64 << 10} {
		req := &echopb.Echo{Text: "hello", Payload: pattern(n, byte(n))}
		var resp echopb.Echo
		if err := cli.Call(timeout(t, 10*time.Second), "Echo.Echo", req, &resp); err != nil {
			t.Fatalf("%d-byte echo: %v", n, err)
		}
		if resp.Text != "hello" || !bytes.Equal(resp.Payload, req.Payload) {
			t.Fatalf("%d-byte echo came back as %q with %d bytes", n, resp.Text, len(resp.Payload))
		}
	}
}

func TestManyCallsInFlightOnOneClient(t *testing.T) {
	cfg := kernelConfig(t, socketIn(t), map[string]any{"ring_size": "64KiB"})
	release := make(chan struct{})
	arrived := make(chan struct{}, 64)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Echo.Gather", func(ctx context.Context, req *echopb.Echo) (*echopb.Echo, error) {
			arrived <- struct{}{}
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	const calls = 64
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			req := &echopb.Echo{Text: strconv.Itoa(i), Payload: pattern(100+i*500, byte(i))}
			var resp echopb.Echo
			err := cli.Call(timeout(t, 20*time.Second), "Echo.Gather", req, &resp)
			if err == nil && (resp.Text != req.Text || !bytes.Equal(resp.Payload, req.Payload)) {
				err = fmt.Errorf("call %d got the answer to %q", i, resp.Text)
			}
			errs <- err
		}()
	}
	// Every call is in the server's hands at once, over one connection.
	for range calls {
		select {
		case <-arrived:
		case <-time.After(20 * time.Second):
			t.Fatal("not every call reached the server")
		}
	}
	close(release)
	for range calls {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestThirtyTwoClientsAtOnce(t *testing.T) {
	waitNoSegments(t)
	opts := map[string]any{"ring_size": "64KiB"}
	addr := socketIn(t)
	cfg := kernelConfig(t, addr, opts)
	srv := startServer(t, cfg, nil)
	const clients, callers, calls = 32, 4, 20
	clis := make([]*kernrpc.Client, clients)
	for i := range clis {
		ccfg := clientConfig(addr, opts)
		ccfg.Client.MaxPoolSize = 1 // one connection, so one segment, per client: counted below
		c, err := kernrpc.NewClient(ccfg, "echo")
		if err != nil {
			t.Fatal(err)
		}
		clis[i] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients*callers)
	for ci, cli := range clis {
		for g := range callers {
			wg.Go(func() {
				for i := range calls {
					n := []int{16, 700, 20000}[(ci+g+i)%3]
					req := &echopb.Echo{Text: fmt.Sprint(ci, g, i), Payload: pattern(n, byte(ci*7+i))}
					var resp echopb.Echo
					if err := cli.Call(timeout(t, 20*time.Second), "Echo.Echo", req, &resp); err != nil {
						errs <- fmt.Errorf("client %d: %w", ci, err)
						return
					}
					if resp.Text != req.Text || !bytes.Equal(resp.Payload, req.Payload) {
						errs <- fmt.Errorf("client %d got the answer to %q for %q", ci, resp.Text, req.Text)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Each client attached a segment of its own: mapped here twice, by the
	// server's end and the client's.
	if n := len(segmentMappings(t)); n != 2*clients {
		t.Errorf("%d segment mappings for %d clients, want %d", n, clients, 2*clients)
	}
	for _, c := range clis {
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	waitNoSegments(t)
}

// rawCodec passes []byte through and decodes in place: the decoded value
// is the request's bytes where they lie, as FlatBuffers reads them.
type rawCodec struct{}

func (rawCodec) Name() string       { return "shm-ring-test-raw" }
func (rawCodec) AliasesInput() bool { return true }
func (rawCodec) Size(v any) int     { return len(*v.(*[]byte)) }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = b
	return nil
}
func (rawCodec) Marshal(dst []byte, v any) ([]byte, error) { return append(dst, *v.(*[]byte)...), nil }

func init() {
	kernel.RegisterCodec(kernel.Factory[kernel.Codec]{Name: rawCodec{}.Name(), Doc: "shm-ring tests: bytes decoded in place",
		New: func(any) (kernel.Codec, error) { return rawCodec{}, nil }})
}

func TestHandlerReadsRequestInPlaceAndAFullRingGivesResourceExhausted(t *testing.T) {
	opts := map[string]any{"ring_size": "64KiB", "wait_timeout": "200ms"}
	cfg := kernelConfig(t, socketIn(t), opts)
	cfg.Codec.Name = rawCodec{}.Name()
	release := make(chan struct{})
	inPlace := make(chan bool, 64)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Raw.Hold", func(ctx context.Context, req *[]byte) (*[]byte, error) {
			inPlace <- inSharedMemory(t, *req)
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	// Held requests stay in the ring while their handlers run: the ring
	// fills, and the next request waits wait_timeout, then fails.
	held := make(chan error, 64)
	var exhausted error
	sent := 0
	for ; sent < 64 && exhausted == nil; sent++ {
		payload := pattern(8000, byte(sent))
		done := make(chan error, 1)
		go func() {
			var resp []byte
			err := cli.Call(timeout(t, 20*time.Second), "Raw.Hold", &payload, &resp)
			if err == nil && !bytes.Equal(resp, payload) {
				err = fmt.Errorf("answer differs from its request")
			}
			done <- err
		}()
		select {
		case err := <-done:
			exhausted = err
		case ok := <-inPlace:
			go func() { held <- <-done }()
			if !ok {
				t.Error("the handler's request was copied out of the shared segment")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a call neither reached the handler nor failed")
		}
	}
	if kernel.CodeOf(exhausted) != kernel.ResourceExhausted {
		t.Fatalf("after %d held requests the next call ended with %v, want ResourceExhausted", sent-1, exhausted)
	}
	close(release)
	for range sent - 1 {
		if err := <-held; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
	// The connection lived through it.
	payload := []byte("again")
	var back []byte
	if err := cli.Call(timeout(t, 10*time.Second), "Raw.Hold", &payload, &back); err != nil || string(back) != "again" {
		t.Fatalf("the client that saw ResourceExhausted, calling again: %v %q", err, back)
	}
}

// A request over max_frame_size fails its own call, with
// ResourceExhausted, and nothing else: calls in flight on the same
// connection are answered, and the next call goes through.
func TestAnOversizedRequestFailsOnlyItsCall(t *testing.T) {
	opts := map[string]any{"max_frame_size": "64KiB"}
	cfg := kernelConfig(t, socketIn(t), opts)
	cfg.Codec.Name = rawCodec{}.Name()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	startServer(t, cfg, func(s *kernrpc.Server) {
		kernrpc.Handle(s, "Raw.Hold", func(ctx context.Context, req *[]byte) (*[]byte, error) {
			started <- struct{}{}
			<-release
			return req, nil
		})
	})
	cli := newClient(t, cfg)
	inFlight := make(chan error, 1)
	go func() {
		payload, resp := []byte("in flight"), []byte(nil)
		err := cli.Call(timeout(t, 10*time.Second), "Raw.Hold", &payload, &resp)
		if err == nil && string(resp) != "in flight" {
			err = fmt.Errorf("answer %q", resp)
		}
		inFlight <- err
	}()
	<-started
	big, resp := pattern(64<<10, 1), []byte(nil)
	err := cli.Call(timeout(t, 10*time.Second), "Raw.Hold", &big, &resp)
	if kernel.CodeOf(err) != kernel.ResourceExhausted {
		t.Fatalf("a request over max_frame_size: %v, want ResourceExhausted", err)
	}
	close(release)
	if err := <-inFlight; err != nil {
		t.Fatalf("a call in flight when another's request was refused: %v", err)
	}
	payload := []byte("again")
	if err := cli.Call(timeout(t, 10*time.Second), "Raw.Hold", &payload, &resp); err != nil || string(resp) != "again" {
		t.Fatalf("the next call: %v %q", err, resp)
	}
}

func TestServerClosesAClientThatDoesNotReadItsAnswers(t *testing.T) {
	addr := socketIn(t)
	startServer(t, kernelConfig(t, addr, map[string]any{"ring_size": "64KiB", "wait_timeout": "200ms"}), nil)
	c, err := newTransport(t, testOptions()).Dial(timeout(t, 10*time.Second), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, err := proto.Marshal(&echopb.Echo{Payload: pattern(8000, 1)})
	if err != nil {
		t.Fatal(err)
	}
	// Twenty answers of 8 KB do not fit a 64 KiB ring nobody reads.
	const calls = 20
	go func() {
		for i := range calls {
			f := &kernel.Frame{Type: kernel.FrameRequest, Flags: kernel.FlagEndStream, CallID: uint64(i + 1),
				Method: "Echo.Echo", Codec: "protobuf", Payload: append(c.Buffer(len(req)), req...)}
			if c.WriteFrame(f) != nil {
				return
			}
		}
	}()
	select {
	case <-time.After(20 * time.Second):
		t.Fatal("the server kept a client that reads nothing")
	case <-waitPeerGone(c):
	}
	// What the server did send is there to read, then the end.
	n := 0
	for {
		f, err := c.ReadFrame(timeout(t, 10*time.Second))
		if err != nil {
			if !errors.Is(err, kernel.ErrPeerGone) {
				t.Fatalf("after %d answers: %v, want the peer gone", n, err)
			}
			break
		}
		n++
		f.Release()
	}
	if n == 0 || n >= calls {
		t.Fatalf("read %d answers of %d before the end, want some but not all", n, calls)
	}
}

// waitPeerGone is closed once c's liveness socket reports the peer gone.
func waitPeerGone(c kernel.Conn) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for !c.(*conn).peerGone.Load() && c.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}()
	return ch
}
