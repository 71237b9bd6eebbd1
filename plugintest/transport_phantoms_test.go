package plugintest

import (
	"context"
	"errors"
	"fmt"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportPhantomCases are broken transports that report something
// happened where nothing did: a dial that connected nowhere, an Accept
// that returns a connection nobody dialled, a read that returns a frame
// nobody sent, an oversized frame written as if it had gone. Like the
// ending cases, each trips complaints no other case had been shown to
// fire; says holds, per path, words of the complaint meant for it.
func transportPhantomCases() []transportCase {
	return []transportCase{
		{
			// Connecting on the first write, as a lazy client does:
			// Dial cannot fail, so a caller learns nothing of a dead
			// address until its first call.
			name: "DialConnectsLazily",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				c, err := tr.inner.Dial(ctx, addr)
				if err != nil {
					return transportPhantom(addr, err), nil
				}
				return tr.wrap(c), nil
			}},
			caught: []string{"Transport/Dial/ClosedAddress", "Transport/Dial/WrongAddress", "Transport/Leaks/FailedDial"},
			says: [][2]string{
				{"Transport/Dial/ClosedAddress", "the address of a closed listener, succeeded; want an error"},
				{"Transport/Dial/WrongAddress", "an address no listener can be at, succeeded; want an error"},
				{"Transport/Leaks/FailedDial", "where nothing listens, succeeded"},
			},
		},
		{
			// An Accept that hands back a connection object whatever
			// happened, its failure to be found on first use.
			name: "AcceptReturnsAConnectionWhenItFails",
			faults: transportFaults{accept: func(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error) {
				c, err := l.Listener.Accept(ctx)
				if err != nil {
					return transportPhantom(l.Addr(), err), nil
				}
				l.tr.markAccepted(c.RemoteAddr())
				return l.tr.wrap(c), nil
			}},
			caught: []string{"Transport/Close/UnblocksAccept", "Transport/Deadline/Accept", "Transport/Leaks/CancelledAccept"},
			says: [][2]string{
				{"Transport/Close/UnblocksAccept", "an Accept pending when the listener closed returned a connection nobody dialled"},
				{"Transport/Close/UnblocksAccept", "Accept after the listener closed returned a connection"},
				{"Transport/Deadline/Accept", "Accept returned a connection nobody dialled"},
				{"Transport/Leaks/CancelledAccept", "returned a connection nobody dialled"},
			},
		},
		{
			// A closed listener whose Accept waits for a connection
			// that can no longer come.
			name: "AcceptAfterCloseWaitsForever",
			faults: transportFaults{accept: func(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error) {
				c, err := l.Listener.Accept(ctx)
				if errors.Is(err, kernel.ErrClosed) {
					<-l.tr.end
				}
				if err != nil {
					return nil, err
				}
				l.tr.markAccepted(c.RemoteAddr())
				return l.tr.wrap(c), nil
			}},
			caught: []string{"Transport/Close/UnblocksAccept", "Transport/Leaks/ListenerAndConns"},
			says: [][2]string{
				{"Transport/Close/UnblocksAccept", "Accept after the listener closed blocked past its context's deadline"},
				{"Transport/Leaks/ListenerAndConns", "an Accept pending when the listener closed was still blocked"},
			},
		},
		{
			// A read that, given up by its caller, returns the empty
			// frame it had made ready to fill.
			name: "ReadReturnsAnEmptyFrameWhenItsContextEnds",
			faults: transportFaults{read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				f, err := c.Conn.ReadFrame(ctx)
				if err != nil && ctx.Err() != nil {
					return &kernel.Frame{Type: kernel.FrameRequest}, nil
				}
				return f, err
			}},
			caught: []string{"Transport/Deadline/ReadCancelled", "Transport/Deadline/ReadExpires"},
			says: [][2]string{
				{"Transport/Deadline/ReadCancelled", "ReadFrame returned a frame nobody sent"},
				{"Transport/Deadline/ReadExpires", "ReadFrame returned a frame nobody sent"},
			},
		},
		{
			// An oversized frame dropped by the writer, which reports
			// success: the call waits for an answer that cannot come.
			name: "OversizedFrameVanishes",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if err := c.Conn.WriteFrame(f); !errors.Is(err, kernel.ErrFrameTooLarge) {
					return err
				}
				return nil
			}},
			caught: []string{"Transport/TooLarge/Refused"},
			says:   [][2]string{{"Transport/TooLarge/Refused", "was accepted by WriteFrame and then vanished"}},
		},
	}
}

// transportPhantom is a connection that never was, to addr: every
// operation fails with why, the error that should have been returned.
func transportPhantom(addr string, why error) kernel.Conn {
	done := make(chan struct{})
	close(done)
	return &transportPhantomConn{addr: addr, err: fmt.Errorf("broken: not connected: %w: %w", kernel.ErrPeerGone, why), done: done}
}

type transportPhantomConn struct {
	addr string
	err  error
	done chan struct{}
}

func (c *transportPhantomConn) Buffer(n int) []byte                              { return make([]byte, 0, n) }
func (c *transportPhantomConn) Recycle([]byte)                                   {}
func (c *transportPhantomConn) WriteFrame(*kernel.Frame) error                   { return c.err }
func (c *transportPhantomConn) ReadFrame(context.Context) (*kernel.Frame, error) { return nil, c.err }
func (c *transportPhantomConn) Close() error                                     { return nil }
func (c *transportPhantomConn) Done() <-chan struct{}                            { return c.done }
func (c *transportPhantomConn) Err() error                                       { return c.err }
func (c *transportPhantomConn) LocalAddr() string                                { return "" }
func (c *transportPhantomConn) RemoteAddr() string                               { return c.addr }
