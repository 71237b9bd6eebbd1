package plugintest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// The good tcp-lv must pass every subtest: the suite has no false
// positives.
func TestTransportPassesTCPLV(t *testing.T) {
	rec := record(t, "Transport", func(t tb) { transportSuite(t, tcplv.Factory, TransportConfig{}) })
	for _, f := range rec.failures {
		t.Errorf("the suite failed the good tcp-lv in %s: %s", f.path, f.msg)
	}
	if why := rec.skippedUnder("Transport/Memory/HeldFrame"); why != "" {
		t.Errorf("the lending checks were skipped for tcp-lv, which lends memory: %s", why)
	}
}

// A transport that does not declare lending still gets the hold checks
// (its memory must then never be reused at all), and tcp-lv underneath
// passes them.
func TestTransportHoldsATransportThatDoesNotLend(t *testing.T) {
	f := transportBroken(t, transportFaults{hidesCapabilities: true})
	rec := record(t, "Transport", func(t tb) {
		transportSuite(transportFocus{t, []string{"Transport/Memory"}}, f, TransportConfig{})
	})
	for _, path := range []string{"Transport/Memory/HeldFrame", "Transport/Memory/HeldBuffer"} {
		if why := rec.skippedUnder(path); why != "" {
			t.Errorf("%s was skipped for a transport that does not lend memory (%s); it applies to every transport", path, why)
		}
	}
	for _, f := range rec.failures {
		t.Errorf("the suite failed a correct transport that does not declare lending in %s: %s", f.path, f.msg)
	}
}

// Each broken transport is tcp-lv with one defect; the suite must fail
// the subtests that check the property it breaks. Only those subtests run,
// to keep this quick; TestTransportPassesTCPLV shows that they pass when
// nothing is broken.
func TestTransportCatchesBrokenTransports(t *testing.T) {
	small := TransportConfig{Options: map[string]any{"max_frame_size": "64KiB"}, MaxFrameSize: 64 << 10, Idle: 300 * time.Millisecond}
	cases := []transportCase{
		{
			name: "CorruptsPayloads",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err == nil && len(f.Payload) > 0 {
					f.Payload[len(f.Payload)/2] ^= 0x20
				}
				return f, err
			}},
			caught: []string{"Transport/Frames/1KiB", "Transport/Frames/Max", "Transport/Frames/InOrder", "Transport/Frames/MaxLargeHeader"},
			says: [][2]string{
				{"Transport/Frames/InOrder", "written back to back on call 7 arrived changed"},
				{"Transport/Frames/MaxLargeHeader", "frame of exactly the maximum length"},
			},
		},
		{
			// The last frame is lost, so only the suite's own bound ends
			// the read waiting for it.
			name: "DropsAFrameAndIgnoresContext",
			faults: transportFaults{
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					if f.CallID == 7 && f.Metadata["seq"] == "99" {
						c.Conn.Recycle(f.Payload)
						return nil
					}
					return c.Conn.WriteFrame(f)
				},
				read: func(_ context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
					return c.Conn.ReadFrame(context.Background())
				},
			},
			caught: []string{"Transport/Frames/InOrder"},
			says:   [][2]string{{"Transport/Frames/InOrder", "ReadFrame ignored its context: still blocked"}},
		},
		{
			name: "DropsMetadata",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err == nil {
					f.Metadata = nil
				}
				return f, err
			}},
			caught: []string{"Transport/Frames/0B", "Transport/Frames/Types"},
		},
		{
			name:   "SwapsFramesReadyTogether",
			faults: transportFaults{read: transportSwap},
			caught: []string{"Transport/Frames/InOrder"},
		},
		{
			name: "DropsFramesOver1MiB",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if len(f.Payload) > 1<<20 {
					c.Conn.Recycle(f.Payload)
					return nil
				}
				return c.Conn.WriteFrame(f)
			}},
			cfg:    &TransportConfig{},
			caught: []string{"Transport/Frames/Max"},
		},
		{
			// On the suite's own goroutines: without recovery there, the
			// panic would end the test binary instead of failing a check.
			name: "PanicsWritingFramesOver1MiB",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if len(f.Payload) > 1<<20 {
					panic("broken transport: frame too big for me")
				}
				return c.Conn.WriteFrame(f)
			}},
			cfg:    &TransportConfig{},
			caught: []string{"Transport/Frames/Max"},
			says:   [][2]string{{"Transport/Frames/Max", "the transport panicked: broken transport: frame too big for me"}},
		},
		{
			name: "PanicsReadingCall7",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err == nil && f.CallID == 7 {
					panic("broken transport: call 7 confuses me")
				}
				return f, err
			}},
			caught: []string{"Transport/Frames/InOrder"},
			says:   [][2]string{{"Transport/Frames/InOrder", "the transport panicked: broken transport: call 7 confuses me"}},
		},
		{
			name: "PanicsAccepting",
			faults: transportFaults{accept: func(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error) {
				panic("broken transport: no accepting today")
			}},
			caught: []string{"Transport/Frames"},
			says:   [][2]string{{"Transport", "the transport panicked: broken transport: no accepting today"}},
		},
		{
			name: "PanicsDialling",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				panic("broken transport: no dialling today")
			}},
			caught: []string{"Transport/Frames"},
			says:   [][2]string{{"Transport", "the transport panicked: broken transport: no dialling today"}},
		},
		{
			name: "ReadFrameReturnsNothing",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err == nil && f.Type == kernel.FrameRequest {
					f.Release()
					return nil, nil
				}
				return f, err
			}},
			caught: []string{"Transport/Frames/0B", "Transport/Frames/1KiB"},
		},
		{
			name: "WriteFrameFailsLargePayloads",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if len(f.Payload) > 32<<10 {
					c.Conn.Recycle(f.Payload)
					return errors.New("payload too large for this transport")
				}
				return c.Conn.WriteFrame(f)
			}},
			caught: []string{"Transport/Frames/Max"},
		},
		{
			name:   "IgnoresMaxFrameSize",
			faults: transportFaults{options: func(o *tcplv.Options) { o.MaxFrameSize *= 4 }},
			caught: []string{"Transport/TooLarge/Refused"},
		},
		{
			name: "OversizedFrameClosesEveryConnection",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				err := c.Conn.WriteFrame(f)
				if errors.Is(err, kernel.ErrFrameTooLarge) {
					c.tr.closeAll()
				}
				return err
			}},
			caught: []string{"Transport/TooLarge/OtherConnsWork"},
			prereq: []string{"Transport/TooLarge/Refused"},
		},
		{
			name: "OversizedFrameRefusedWithoutSayingWhy",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				err := c.Conn.WriteFrame(f)
				if errors.Is(err, kernel.ErrFrameTooLarge) {
					return errors.New("broken: write failed")
				}
				return err
			}},
			caught: []string{"Transport/TooLarge/Refused"},
		},
		{
			name:   "OversizedFrameRefusalBreaksTheNextWrite",
			faults: transportFaults{write: transportAfterRefusal(false, errors.New("broken: the writer is stuck after a refusal"))},
			caught: []string{"Transport/TooLarge/Refused"},
		},
		{
			name: "OversizedFrameKillsTheConnectionButErrForgets",
			faults: transportFaults{
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					err := c.Conn.WriteFrame(f)
					if errors.Is(err, kernel.ErrFrameTooLarge) {
						c.Conn.Close()
						return fmt.Errorf("broken: %w", kernel.ErrFrameTooLarge)
					}
					return err
				},
				err: func(c *transportFaultyConn) error { return nil },
			},
			caught: []string{"Transport/TooLarge/Refused"},
		},
		{
			// It passes the frame off as written and drops the connection,
			// as a receiver refusing it would, but its Done stays open.
			name: "OversizedFrameFailsTheReaderButDoneStaysOpen",
			faults: transportFaults{
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					err := c.Conn.WriteFrame(f)
					if errors.Is(err, kernel.ErrFrameTooLarge) {
						c.Conn.Close()
						return nil
					}
					return err
				},
				done: func(c *transportFaultyConn) <-chan struct{} { return c.never },
			},
			caught: []string{"Transport/TooLarge/Refused"},
			says:   [][2]string{{"Transport/TooLarge/Refused", "failed on a frame (client→server) over the maximum frame size"}},
		},
		{
			name: "CallTableOf32",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if id := f.CallID; id > 32 && id <= 1024 {
					g := *f
					g.CallID = (id-1)%32 + 1
					f = &g
				}
				return c.Conn.WriteFrame(f)
			}},
			caught: []string{"Transport/Concurrent/Calls"},
		},
		{
			name:   "ReusesLentPayloads",
			faults: transportFaults{read: transportReadIntoSharedBuffer},
			caught: []string{"Transport/Memory/HeldFrame"},
		},
		{
			name: "HandsOutTheSameBufferTwice",
			faults: transportFaults{
				buffer: func(c *transportFaultyConn, n int) []byte {
					c.mu.Lock()
					defer c.mu.Unlock()
					if cap(c.shared) < n {
						c.shared = make([]byte, 0, n)
					}
					return c.shared[:0]
				},
				recycle: func(*transportFaultyConn, []byte) {},
				write:   transportWriteFromOwnBuffer,
			},
			caught: []string{"Transport/Memory/HeldBuffer"},
		},
		{
			// It hands a recycled buffer out again, and when a frame is
			// written from it sends what the buffer held when recycled,
			// as if it had cached its encoding.
			name: "SendsARecycledBuffersOldBytes",
			faults: transportFaults{
				recycle: func(c *transportFaultyConn, b []byte) {
					c.mu.Lock()
					defer c.mu.Unlock()
					c.stale, c.shared = b[:0], slices.Clone(b)
				},
				buffer: func(c *transportFaultyConn, n int) []byte {
					c.mu.Lock()
					defer c.mu.Unlock()
					if cap(c.stale) >= max(n, 1) {
						return c.stale
					}
					return c.Conn.Buffer(n)
				},
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					c.mu.Lock()
					if p := f.Payload; len(p) > 0 && cap(c.stale) > 0 && &p[0] == &c.stale[:1][0] {
						copy(p, c.shared)
					}
					c.mu.Unlock()
					return transportWriteFromOwnBuffer(c, f)
				},
			},
			caught: []string{"Transport/Memory/Buffer"},
			says:   [][2]string{{"Transport/Memory/Buffer", "after a Recycle arrived changed"}},
		},
		{
			name: "BufferSmallerThanAsked",
			faults: transportFaults{
				buffer: func(_ *transportFaultyConn, n int) []byte { return make([]byte, 0, n/2) },
				write:  transportWriteFromOwnBuffer,
			},
			caught: []string{"Transport/Memory/Buffer"},
		},
		{
			name: "OptionsAcceptUnknownKeys",
			factory: func(transportCleanups) kernel.Factory[kernel.Transport] {
				return kernel.Factory[kernel.Transport]{
					Name:       "lax-tcp-lv",
					NewOptions: func() any { return &map[string]any{} },
					New:        func(any) (kernel.Transport, error) { return tcplv.New(nil) },
				}
			},
			caught: []string{"Transport/Options/UnknownKey"},
		},
	}
	cases = append(cases, transportLifecycleCases()...)
	cases = append(cases, transportBoundaryCases()...)
	cases = append(cases, transportEndingCases()...)
	cases = append(cases, transportConcurrencyCases()...)
	cases = append(cases, transportPhantomCases()...)
	cases = append(cases, transportOptionalCases()...)
	run := func(c transportCase) *recording {
		var cleanups transportCleanupList
		defer cleanups.run()
		var f kernel.Factory[kernel.Transport]
		if c.factory != nil {
			f = c.factory(&cleanups)
		} else {
			f = transportBroken(&cleanups, c.faults)
		}
		cfg := small
		if c.cfg != nil {
			cfg = *c.cfg
		}
		cfg.Patience = transportCasePatience
		return recordQuiet("Transport", func(t tb) { transportSuite(transportFocus{t, append(c.prereq, c.caught...)}, f, cfg) })
	}
	// Most of the time goes to waiting out what a defect prevents, so the
	// cases wait together, more of them at once than -parallel would let
	// run on a machine of few cores. Those that count goroutines or
	// descriptors run alone afterwards, so that no other case's can be
	// taken for theirs.
	recs := make([]chan *recording, len(cases))
	sem := make(chan struct{}, 6)
	// A case -run leaves out still runs; the test waits for it, or it
	// would outlive the test (goleak).
	var running sync.WaitGroup
	defer running.Wait()
	for i, c := range cases {
		recs[i] = make(chan *recording, 1)
		if c.serial {
			continue
		}
		running.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			recs[i] <- run(c)
		})
	}
	for _, serial := range []bool{false, true} {
		for i, c := range cases {
			if c.serial != serial {
				continue
			}
			t.Run(c.name, func(t *testing.T) {
				if c.linux && runtime.GOOS != "linux" {
					t.Skip("descriptors are listed on Linux only")
				}
				var rec *recording
				if c.serial {
					rec = run(c)
				} else {
					rec = <-recs[i]
				}
				for _, f := range rec.failures {
					t.Logf("recorded failure (expected of a broken plugin): %s: %s", f.path, f.msg)
				}
				for _, path := range c.caught {
					expectCaught(t, rec, path)
				}
				for _, said := range c.says {
					expectMessage(t, rec, said[0], said[1])
				}
			})
		}
	}
}

// transportCasePatience is how long the suite waits, run against a
// broken transport, for what a defect prevents: short, as the wait is
// certain to run out.
const transportCasePatience = 500 * time.Millisecond

// transportCase is one broken transport and the subtests that must catch
// it.
type transportCase struct {
	name    string
	faults  transportFaults
	factory func(t transportCleanups) kernel.Factory[kernel.Transport] // instead of faults
	cfg     *TransportConfig                                           // nil: a 64KiB maximum frame size, which keeps the run quick
	caught  []string
	says    [][2]string // a path of caught, and words its complaint must hold
	prereq  []string    // subtests that must run before caught ones for the defect to show
	serial  bool        // counts goroutines or descriptors: runs alone, after the others
	linux   bool        // shows only where descriptors can be listed
}

// transportCleanups is where a broken transport leaves what is to be
// let go once its case is recorded.
type transportCleanups interface{ Cleanup(func()) }

// transportCleanupList runs cleanups last first, as testing does.
type transportCleanupList struct {
	mu  sync.Mutex
	fns []func()
}

func (l *transportCleanupList) Cleanup(f func()) {
	l.mu.Lock()
	l.fns = append(l.fns, f)
	l.mu.Unlock()
}

func (l *transportCleanupList) run() {
	l.mu.Lock()
	fns := l.fns
	l.fns = nil
	l.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// recordQuiet runs suite under a recorder, as record does, without a live
// test to log to: the caller logs what it recorded.
func recordQuiet(name string, suite func(t tb)) *recording {
	rec := &recording{}
	newRecorder(name, nil, rec).runBody(suite)
	return rec
}

// transportFocus runs only the subtests on the way to, or under, paths.
type transportFocus struct {
	tb
	paths []string
}

func (f transportFocus) Run(name string, run func(t tb)) bool {
	full := f.Name() + "/" + name
	for _, p := range f.paths {
		if p == full || strings.HasPrefix(p, full+"/") || strings.HasPrefix(full, p+"/") {
			return f.tb.Run(name, func(t tb) { run(transportFocus{t, f.paths}) })
		}
	}
	return true
}
