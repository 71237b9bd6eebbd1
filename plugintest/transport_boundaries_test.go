package plugintest

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/transport/tcplv"
)

// transportBoundaryCases are broken transports whose defects lie where the
// suite once did not look: at size and width boundaries, in long and
// unusual header strings, after idle periods, on failed and cancelled
// dials and accepts, and in memory held above a transport's large-frame
// path. Each passed the suite before it checked there.
func transportBoundaryCases() []transportCase {
	const max = 64 << 10 // the small configuration's maximum
	return []transportCase{
		{
			// A frame just above its large-frame threshold loses its last
			// byte: the last partial word of the first chunk, say.
			name: "OffByOneJustAboveItsLargePath",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if n := transportBodyLen(f) + len(f.Payload); n > 20000 && n <= 20008 {
					g := transportHeader(f)
					g.Payload = f.Payload[:len(f.Payload)-1]
					return c.Conn.WriteFrame(g)
				}
				return c.Conn.WriteFrame(f)
			}},
			cfg:    &TransportConfig{Options: map[string]any{"max_frame_size": "64KiB"}, MaxFrameSize: 64 << 10, LargeFrame: 20000},
			caught: []string{"Transport/Frames/Sizes"},
		},
		{
			name: "StoresCodesInAByte",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				g := transportHeader(f)
				g.Code = kernel.Code(uint8(f.Code))
				g.Payload = f.Payload
				return c.Conn.WriteFrame(g)
			}},
			caught: []string{"Transport/Frames/Widths"},
		},
		{
			// Strings with a two-byte length: 16383 bytes at most.
			name: "TruncatesHeaderStringsAt16KiB",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				cut := func(s string) string { return s[:min(len(s), 1<<14-1)] }
				g := transportHeader(f)
				g.Method, g.Codec, g.Message = cut(f.Method), cut(f.Codec), cut(f.Message)
				if f.Metadata != nil {
					g.Metadata = make(kernel.Metadata, len(f.Metadata))
					for k, v := range f.Metadata {
						g.Metadata[cut(k)] = cut(v)
					}
				}
				g.Payload = f.Payload
				return c.Conn.WriteFrame(g)
			}},
			caught: []string{"Transport/Frames/Widths"},
		},
		{
			name:   "MetadataTableOf64",
			faults: transportFaults{read: transportMapMetadata(func(md kernel.Metadata) kernel.Metadata { return transportFirst(md, 64) })},
			caught: []string{"Transport/Frames/Widths"},
		},
		{
			// As HTTP/2 does with header names.
			name:   "LowercasesMetadataKeys",
			faults: transportFaults{read: transportMapMetadata(transportLowerKeys)},
			caught: []string{"Transport/Frames/Strings"},
		},
		{
			// As a transport that carries headers as text would.
			name: "MangleBinaryMetadata",
			faults: transportFaults{read: transportMapMetadata(func(md kernel.Metadata) kernel.Metadata {
				out := make(kernel.Metadata, len(md))
				for k, v := range md {
					out[strings.ToValidUTF8(k, "\uFFFD")] = strings.ToValidUTF8(v, "\uFFFD")
				}
				return out
			})},
			caught: []string{"Transport/Frames/Strings"},
		},
		{
			// Its size check counts every field's length as one byte.
			name: "CountsLongFieldsAsShort",
			faults: transportFaults{
				options: func(o *tcplv.Options) { o.MaxFrameSize *= 4 },
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					if transportShortCount(f) > max {
						c.Conn.Recycle(f.Payload)
						return fmt.Errorf("%w: %w", &kernel.Status{Code: kernel.ResourceExhausted, Message: "frame too large"}, kernel.ErrFrameTooLarge)
					}
					return c.Conn.WriteFrame(f)
				},
			},
			caught: []string{"Transport/TooLarge/LargeHeader"},
		},
		{
			// What tcp-lv and shm-ring did: the kernel then takes the
			// connection for dead, and fails every call on it.
			name: "RefusesAFrameOverTheMaximumWithAPlainError",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				err := c.Conn.WriteFrame(f)
				if errors.Is(err, kernel.ErrFrameTooLarge) {
					return fmt.Errorf("broken: frame over the maximum: %w", kernel.ErrFrameTooLarge)
				}
				return err
			}},
			caught: []string{"Transport/TooLarge/Refused", "Transport/TooLarge/RefusedFromServer"},
		},
		{
			// Its header went out before the check: the peer skips what
			// follows, the next frame.
			name:   "RefusalSwallowsTheNextFrame",
			faults: transportFaults{write: transportAfterRefusal(true, nil)},
			caught: []string{"Transport/TooLarge/Refused"},
		},
		{
			// An idle timeout that knows nothing of keepalive.
			name: "ClosesConnectionsIdleFor100ms",
			faults: transportFaults{started: func(c *transportFaultyConn) {
				go func() {
					tick := time.NewTicker(10 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-tick.C:
							if time.Since(time.Unix(0, c.active.Load())) > 100*time.Millisecond {
								c.Conn.Close()
								return
							}
						case <-c.Conn.Done():
							return
						case <-c.tr.end:
							return
						}
					}
				}()
			}},
			caught: []string{"Transport/Idle/Unused"},
		},
		{
			// A keepalive without Pings: a read that hears nothing for
			// 100ms declares the peer gone.
			name: "ReadGivesUpOnASlowAnswer",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				f, err := c.Conn.ReadFrame(rctx)
				if err != nil && rctx.Err() != nil && ctx.Err() == nil {
					c.Conn.Close()
					return nil, fmt.Errorf("broken: nothing heard for 100ms: %w", kernel.ErrPeerGone)
				}
				return f, err
			}},
			caught: []string{"Transport/Idle/AwaitingAnswer"},
		},
		{
			// A background redial, started when a dial fails, that Close
			// never stops.
			name: "FailedDialLeaksARedialer",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				c, err := tr.inner.Dial(ctx, addr)
				if err != nil {
					go func() { <-tr.end }()
					return nil, err
				}
				return tr.wrap(c), nil
			}},
			caught: []string{"Transport/Leaks/FailedDial"},
			serial: true,
		},
		{
			// A descriptor opened before the dial (a socket, a lock file)
			// and closed on success only.
			name: "FailedDialLeaksADescriptor",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				file, ferr := os.Open(os.DevNull)
				c, err := tr.inner.Dial(ctx, addr)
				if err != nil {
					if ferr == nil {
						tr.mu.Lock()
						tr.files = append(tr.files, file)
						tr.mu.Unlock()
					}
					return nil, err
				}
				if ferr == nil {
					file.Close()
				}
				return tr.wrap(c), nil
			}},
			caught: []string{"Transport/Leaks/FailedDial"},
			serial: true,
			linux:  true,
		},
		{
			name:   "CancelledDialLeaksItsConnection",
			faults: transportFaults{dial: transportDialAbandoningOnCancel},
			caught: []string{"Transport/Leaks/CancelledDial"},
			serial: true,
		},
		{
			name:   "CancelledAcceptStrandsItsWaiter",
			faults: transportFaults{accept: transportAcceptWithWaiter},
			caught: []string{"Transport/Leaks/CancelledAccept"},
			serial: true,
		},
		{
			// Frames above its large path are reassembled in one buffer
			// per connection, reused by the next whether or not released.
			name: "ReusesPayloadsAboveItsLargePath",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err != nil || transportBodyLen(f)+len(f.Payload) <= 100000 {
					return f, err
				}
				return transportShare(c, f), nil
			}},
			cfg:    &TransportConfig{Options: map[string]any{"max_frame_size": "256KiB"}, MaxFrameSize: 256 << 10, LargeFrame: 100000},
			caught: []string{"Transport/Memory/HeldFrame"},
		},
		{
			// It says it lends nothing, so the suite once skipped the hold
			// checks; yet it serves payloads of 4 to 8KiB from one buffer
			// per connection, a size class pooled by mistake.
			name: "ClaimsNotToLendButReusesPayloads",
			faults: transportFaults{hidesCapabilities: true, read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err != nil || len(f.Payload) < 4<<10 || len(f.Payload) >= 8<<10 {
					return f, err
				}
				return transportShare(c, f), nil
			}},
			caught: []string{"Transport/Memory/HeldFrame"},
		},
		{
			// Buffer sizes by power of two, one short past each: a
			// capacity of 2^k for 2^k+1 bytes.
			name: "BufferShortPastPowersOfTwo",
			faults: transportFaults{
				buffer: func(_ *transportFaultyConn, n int) []byte {
					if n <= 2 {
						return make([]byte, 0, n)
					}
					return make([]byte, 0, 1<<bits.Len(uint(n-2)))
				},
				write: transportWriteFromOwnBuffer,
			},
			caught: []string{"Transport/Memory/Buffer"},
		},
	}
}

// transportShare copies f's payload into c's one shared buffer, which
// the next shared frame overwrites, and releases f.
func transportShare(c *transportFaultyConn, f *kernel.Frame) *kernel.Frame {
	c.mu.Lock()
	c.shared = append(c.shared[:0], f.Payload...)
	g := transportHeader(f)
	g.Payload = c.shared
	c.mu.Unlock()
	f.Release()
	return g
}

// transportShortCount is a frame's length as a transport that counts
// every field's length as one byte has it.
func transportShortCount(f *kernel.Frame) int {
	n := transportBodyLen(f) + len(f.Payload)
	long := func(l int) int { // bytes a uvarint of l takes beyond one
		return (bits.Len(uint(l))+6)/7 - 1
	}
	for _, s := range []string{f.Method, f.Codec, f.Message} {
		if s != "" {
			n -= max(0, long(len(s)))
		}
	}
	for k, v := range f.Metadata {
		n -= max(0, long(len(k)+len(v)+1))
	}
	return n
}

// transportMapMetadata is a ReadFrame that hands out frames with their
// metadata passed through m.
func transportMapMetadata(m func(kernel.Metadata) kernel.Metadata) func(context.Context, *transportFaultyConn) (*kernel.Frame, error) {
	return func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
		f, err := c.Conn.ReadFrame(ctx)
		if err == nil && f.Metadata != nil {
			f.Metadata = m(f.Metadata)
		}
		return f, err
	}
}

func transportLowerKeys(md kernel.Metadata) kernel.Metadata {
	out := make(kernel.Metadata, len(md))
	for k, v := range md {
		out[strings.ToLower(k)] = v
	}
	return out
}

// transportFirst keeps n of md's entries.
func transportFirst(md kernel.Metadata, n int) kernel.Metadata {
	if len(md) <= n {
		return md
	}
	out := make(kernel.Metadata, n)
	for k, v := range md {
		if len(out) == n {
			break
		}
		out[k] = v
	}
	return out
}

// transportDialAbandoningOnCancel dials on a goroutine of its own and
// returns when ctx is done; the goroutine, its result channel unbuffered,
// then waits forever to hand over the connection it made.
func transportDialAbandoningOnCancel(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
	results := make(chan transportConnErr) // the defect: unbuffered
	go func() {
		c, err := tr.inner.Dial(context.Background(), addr)
		select {
		case results <- transportConnErr{c, err}:
		case <-tr.end:
			if err == nil {
				c.Close()
			}
		}
	}()
	select {
	case r := <-results:
		if r.err != nil {
			return nil, r.err
		}
		return tr.wrap(r.c), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("broken: dial %s: %w", addr, ctx.Err())
	}
}

// transportAcceptWithWaiter keeps one goroutine in the inner Accept, whose
// result the next Accept takes; an Accept whose ctx is done returns and
// leaves it waiting. Once the listener closes, it waits forever to hand
// over the error, unless an Accept was pending then.
func transportAcceptWithWaiter(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error) {
	l.mu.Lock()
	if l.results == nil {
		l.results = make(chan transportConnErr) // the defect: unbuffered
	}
	if !l.waiting {
		l.waiting = true
		go func() {
			c, err := l.Listener.Accept(context.Background())
			select {
			case l.results <- transportConnErr{c, err}:
			case <-l.tr.end:
				if err == nil {
					c.Close()
				}
			}
		}()
	}
	results := l.results
	l.mu.Unlock()
	select {
	case r := <-results:
		l.mu.Lock()
		l.waiting = false
		l.mu.Unlock()
		if r.err != nil {
			return nil, r.err
		}
		l.tr.markAccepted(r.c.RemoteAddr())
		return l.tr.wrap(r.c), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A LargeFrame the maximum leaves no room above is a configuration the
// suite cannot honour: it fails at once, saying what to configure,
// rather than skipping the frames above it.
func TestTransportFailsALargeFrameAboveTheMaximum(t *testing.T) {
	cfg := TransportConfig{Options: map[string]any{"max_frame_size": "64KiB"}, MaxFrameSize: 64 << 10, LargeFrame: 64 << 10}
	rec := recordQuiet("Transport", func(t tb) { transportSuite(t, tcplv.Factory, cfg) })
	if len(rec.failures) != 1 || rec.failures[0].path != "Transport" || !strings.Contains(rec.failures[0].msg, "configure a MaxFrameSize") {
		t.Errorf("LargeFrame equal to MaxFrameSize: failures %v; want one, at the root, saying what to configure", rec.failures)
	}
}
