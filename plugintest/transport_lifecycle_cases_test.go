package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportLifecycleCases are the broken transports whose defect is in a
// lifecycle: a read or dial that ignores its context, a close that
// leaves the peer or a blocked read uninformed, an error that forgets
// why, a goroutine left behind.
func transportLifecycleCases() []transportCase {
	return []transportCase{
		{
			name: "ReadFrameIgnoresContext",
			faults: transportFaults{read: func(_ context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
				return c.Conn.ReadFrame(context.Background())
			}},
			caught: []string{"Transport/Deadline/ReadCancelled", "Transport/Deadline/ReadExpires"},
		},
		{
			name:   "LosesTheFrameAfterAnInterruptedRead",
			faults: transportFaults{read: transportLoseAfterInterrupt},
			caught: []string{"Transport/Deadline/ReadExpires", "Transport/Deadline/ReadResumes"},
		},
		{
			name: "CloseLeavesReadsBlocked",
			faults: transportFaults{close: func(c *transportFaultyConn) error {
				c.closeOnce.Do(func() { go func() { <-c.tr.end; c.Conn.Close() }() })
				return nil
			}},
			caught: []string{"Transport/Close/UnblocksRead"},
		},
		{
			name:   "CloseDoesNotTellThePeer",
			faults: transportFaults{read: transportReadUntilClosed, write: transportWriteUntilClosed, close: transportCloseLocally, done: transportDoneLocally},
			caught: []string{"Transport/Close/UnblocksPeerRead", "Transport/Close/UnblocksPeerWrite"},
		},
		{
			name: "WriteCutShortByCloseHangs",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				err := c.Conn.WriteFrame(f)
				if errors.Is(err, kernel.ErrClosed) {
					<-c.tr.end
				}
				return err
			}},
			caught: []string{"Transport/Close/UnblocksWrite"},
		},
		{
			name: "WriteCutShortByThePeerHangs",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				err := c.Conn.WriteFrame(f)
				if errors.Is(err, kernel.ErrPeerGone) {
					<-c.tr.end
				}
				return err
			}},
			caught: []string{"Transport/Close/UnblocksPeerWrite"},
		},
		{
			name: "WriteAfterCloseSucceeds",
			faults: transportFaults{write: func(c *transportFaultyConn, f *kernel.Frame) error {
				if err := c.Conn.WriteFrame(f); !errors.Is(err, kernel.ErrClosed) {
					return err
				}
				return nil
			}},
			caught: []string{"Transport/Close/OperationsFail"},
		},
		{
			name: "ClosedConnFailsWithoutErrClosed",
			faults: transportFaults{
				read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
					f, err := c.Conn.ReadFrame(ctx)
					if errors.Is(err, kernel.ErrClosed) {
						return nil, io.EOF
					}
					return f, err
				},
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					err := c.Conn.WriteFrame(f)
					if errors.Is(err, kernel.ErrClosed) {
						return errors.New("use of a closed connection")
					}
					return err
				},
			},
			caught: []string{"Transport/Close/UnblocksRead", "Transport/Close/UnblocksWrite", "Transport/Close/OperationsFail"},
			says:   [][2]string{{"Transport/Close/UnblocksWrite", "a WriteFrame blocked when Close was called returned use of a closed connection"}},
		},
		{
			name:   "DoneNeverCloses",
			faults: transportFaults{done: func(c *transportFaultyConn) <-chan struct{} { return c.never }},
			caught: []string{"Transport/Close/OperationsFail", "Transport/Close/UnblocksPeerRead", "Transport/PeerGone/ServerNotices"},
			says:   [][2]string{{"Transport/Close/UnblocksPeerRead", "its Done did not close"}},
		},
		{
			name: "CloseTwicePanics",
			faults: transportFaults{close: func(c *transportFaultyConn) error {
				again, err := c.closeMarked()
				if again {
					panic("close of a closed connection")
				}
				return err
			}},
			caught: []string{"Transport/Close/Twice"},
		},
		{
			name: "CloseTwiceFails",
			faults: transportFaults{close: func(c *transportFaultyConn) error {
				if again, err := c.closeMarked(); again || err != nil {
					return errors.New("broken: close: bad file descriptor")
				}
				return nil
			}},
			caught: []string{"Transport/Close/Twice"},
		},
		{
			name: "CloseReportsAnError",
			faults: transportFaults{close: func(c *transportFaultyConn) error {
				_, err := c.closeMarked()
				return errors.Join(err, errors.New("broken: close: connection reset by peer"))
			}},
			caught: []string{"Transport/Close/UnblocksRead", "Transport/Close/UnblocksPeerRead", "Transport/Close/UnblocksWrite", "Transport/Close/OperationsFail"},
			says:   [][2]string{{"Transport/Close/UnblocksWrite", "Close: broken: close: connection reset by peer; want nil"}},
		},
		{
			name: "ErrForgetsClose",
			faults: transportFaults{err: func(c *transportFaultyConn) error {
				if errors.Is(c.Conn.Err(), kernel.ErrClosed) {
					return nil
				}
				return c.Conn.Err()
			}},
			caught: []string{"Transport/Close/OperationsFail"},
		},
		{
			name: "ErrHidesWhyTheConnectionDied",
			faults: transportFaults{err: func(c *transportFaultyConn) error {
				if err := c.Conn.Err(); err != nil {
					return io.EOF
				}
				return nil
			}},
			caught: []string{"Transport/Close/OperationsFail", "Transport/PeerGone/ServerNotices", "Transport/PeerGone/ClientNotices"},
		},
		{
			name: "ListenerCloseLeavesAcceptBlocked",
			faults: transportFaults{closeListener: func(l *transportFaultyListener) error {
				l.closeOnce.Do(func() { go func() { <-l.tr.end; l.Listener.Close() }() })
				return nil
			}},
			caught: []string{"Transport/Close/UnblocksAccept"},
		},
		{
			name: "ListenerCloseClosesItsConns",
			faults: transportFaults{closeListener: func(l *transportFaultyListener) error {
				err := l.Listener.Close()
				l.tr.closeAll()
				return err
			}},
			caught: []string{"Transport/Close/ListenerLeavesConns"},
		},
		{
			name: "VanishedPeerGoesUnnoticed",
			faults: transportFaults{
				read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
					f, err := c.Conn.ReadFrame(ctx)
					if errors.Is(err, kernel.ErrPeerGone) {
						<-ctx.Done()
						return nil, ctx.Err()
					}
					return f, err
				},
				close: transportCloseLocallyToo,
				done:  transportDoneLocally,
			},
			caught: []string{"Transport/PeerGone/ServerNotices", "Transport/PeerGone/ClientNotices"},
		},
		{
			name: "DialRetriesUntilTheDeadline",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				for {
					c, err := tr.inner.Dial(ctx, addr)
					if err == nil {
						return tr.wrap(c), nil
					}
					select {
					case <-ctx.Done():
						return nil, fmt.Errorf("dial %s: gave up: %w", addr, ctx.Err())
					case <-time.After(10 * time.Millisecond):
					}
				}
			}},
			caught: []string{"Transport/Dial/ClosedAddress", "Transport/Dial/WrongAddress"},
		},
		{
			name: "DialIgnoresContext",
			faults: transportFaults{dial: func(_ context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				c, err := tr.inner.Dial(context.Background(), addr)
				if err != nil {
					return nil, err
				}
				return tr.wrap(c), nil
			}},
			caught: []string{"Transport/Dial/Cancelled", "Transport/Dial/Expired"},
		},
		{
			name:   "DialWaitsForAcceptPastItsDeadline",
			faults: transportFaults{dial: transportDialAwaitingAccept},
			caught: []string{"Transport/Dial/NotAccepted", "Transport/Dial/NotAcceptedCancelled", "Transport/Leaks/CancelledDial"},
			says: [][2]string{
				{"Transport/Leaks/CancelledDial", "into the dial did not return within"},
			},
		},
		{
			name:   "DialWaitsForAcceptPastItsCancellation",
			faults: transportFaults{dial: transportDialAwaitingAcceptByDeadline},
			caught: []string{"Transport/Dial/NotAcceptedCancelled"},
		},
		{
			name: "AcceptIgnoresContext",
			faults: transportFaults{accept: func(_ context.Context, l *transportFaultyListener) (kernel.Conn, error) {
				c, err := l.Listener.Accept(context.Background())
				if err != nil {
					return nil, err
				}
				return l.tr.wrap(c), nil
			}},
			caught: []string{"Transport/Deadline/Accept", "Transport/Leaks/CancelledAccept"},
			says: [][2]string{
				{"Transport/Leaks/CancelledAccept", "Accept with a context cancelled before the wait did not return within"},
			},
		},
		{
			name: "LeaksAGoroutinePerConnection",
			faults: transportFaults{started: func(c *transportFaultyConn) {
				go func() { <-c.tr.end }()
			}},
			caught: []string{"Transport/Leaks/ListenerAndConns"},
			serial: true,
		},
	}
}
