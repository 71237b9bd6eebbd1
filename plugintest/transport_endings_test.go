package plugintest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportEndingCases are broken transports that get an ending wrong:
// a close, a vanished peer, a context that ran out, an idle spell. Each
// makes a mistake real transports make (a zeroed ring read as a frame, a
// socket's own timeout error, a read deadline that kills the
// connection), and each went uncaught by any other case, so that the
// complaint it trips had never been shown to fire. says holds, per path,
// words of the complaint the suite must make there.
func transportEndingCases() []transportCase {
	return []transportCase{
		{
			// A ring whose writer has gone reads as zeros: a frame of
			// type 0, to a transport that trusts it.
			name: "ReadInventsAFrameAtTheEnd",
			faults: transportFaults{read: transportAtTheEnd(func() (*kernel.Frame, error) {
				return &kernel.Frame{}, nil
			})},
			caught: []string{"Transport/Close/UnblocksRead", "Transport/Close/UnblocksPeerRead", "Transport/Close/OperationsFail", "Transport/PeerGone/ServerNotices"},
			says: [][2]string{
				{"Transport/Close/UnblocksRead", "returned a frame nobody sent"},
				{"Transport/Close/UnblocksPeerRead", "returned a frame nobody sent"},
				{"Transport/Close/OperationsFail", "ReadFrame after Close returned a frame"},
				{"Transport/PeerGone/ServerNotices", "ReadFrame returned a frame nobody sent"},
			},
		},
		{
			name: "ReadReturnsNilNilAtTheEnd",
			faults: transportFaults{read: transportAtTheEnd(func() (*kernel.Frame, error) {
				return nil, nil
			})},
			caught: []string{"Transport/Close/UnblocksRead", "Transport/Close/OperationsFail"},
			says: [][2]string{
				{"Transport/Close/UnblocksRead", errReadNothing.Error()},
				{"Transport/Close/OperationsFail", errReadNothing.Error()},
			},
		},
		{
			name: "ErrForgetsTheVanishedPeer",
			faults: transportFaults{err: func(c *transportFaultyConn) error {
				if err := c.Conn.Err(); !errors.Is(err, kernel.ErrPeerGone) {
					return err
				}
				return nil
			}},
			caught: []string{"Transport/Close/UnblocksPeerRead", "Transport/PeerGone/ServerNotices"},
			says: [][2]string{
				{"Transport/Close/UnblocksPeerRead", "its Err is nil"},
				{"Transport/PeerGone/ServerNotices", "want an error wrapping kernel.ErrPeerGone"},
			},
		},
		{
			// The second Close waits for a shutdown the first one did,
			// long past the suite's patience. Not forever: the suite's own
			// cleanups close the connection again.
			name: "SecondCloseHangs",
			faults: transportFaults{close: func(c *transportFaultyConn) error {
				again, err := c.closeMarked()
				if again {
					time.Sleep(3 * transportCasePatience)
				}
				return err
			}},
			caught: []string{"Transport/Close/Twice"},
			says: [][2]string{
				{"Transport/Close/Twice", "Close number 2 did not return"},
				{"Transport/Close/Twice", "two concurrent Close calls did not both return"},
			},
		},
		{
			name: "OperationsAfterCloseHang",
			faults: transportFaults{
				close: func(c *transportFaultyConn) error {
					_, err := c.closeMarked()
					return err
				},
				read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
					if c.isClosed() {
						<-c.tr.end
					}
					return c.Conn.ReadFrame(ctx)
				},
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					if c.isClosed() {
						<-c.tr.end
					}
					return c.Conn.WriteFrame(f)
				},
			},
			caught: []string{"Transport/Close/OperationsFail"},
			says: [][2]string{
				{"Transport/Close/OperationsFail", "ReadFrame after Close blocked past its context's deadline"},
				{"Transport/Close/OperationsFail", "WriteFrame after Close did not return"},
			},
		},
		{
			name: "ListenerCloseReportsAnError",
			faults: transportFaults{closeListener: func(l *transportFaultyListener) error {
				return errors.Join(l.Listener.Close(), errors.New("broken: close: bad file descriptor"))
			}},
			caught: []string{"Transport/Close/UnblocksAccept", "Transport/Close/ListenerLeavesConns"},
			says: [][2]string{
				{"Transport/Close/UnblocksAccept", "listener Close: broken"},
				{"Transport/Close/ListenerLeavesConns", "listener Close: broken"},
			},
		},
		{
			name: "ClosedListenerFailsWithoutErrClosed",
			faults: transportFaults{accept: transportAcceptFailing(func(ctx context.Context, err error) error {
				if errors.Is(err, kernel.ErrClosed) {
					return errors.New("accept tcp: use of closed network connection")
				}
				return err
			})},
			caught: []string{"Transport/Close/UnblocksAccept"},
			says: [][2]string{
				{"Transport/Close/UnblocksAccept", "an Accept pending when the listener closed returned accept tcp"},
			},
		},
		{
			name: "DialWithADoneContextFailsVaguely",
			faults: transportFaults{dial: func(ctx context.Context, tr *transportFaulty, addr string) (kernel.Conn, error) {
				if ctx.Err() != nil {
					return nil, errors.New("broken: dial " + addr + ": aborted")
				}
				c, err := tr.inner.Dial(ctx, addr)
				if err != nil {
					return nil, err
				}
				return tr.wrap(c), nil
			}},
			caught: []string{"Transport/Dial/Cancelled", "Transport/Dial/Expired"},
			says: [][2]string{
				{"Transport/Dial/Cancelled", "want an error wrapping context canceled"},
				{"Transport/Dial/Expired", "want an error wrapping context deadline exceeded"},
			},
		},
		{
			// A socket's deadline error, where the caller's context ran out.
			name: "ReadTimesOutWithItsOwnError",
			faults: transportFaults{read: transportOnContextEnd(func(c *transportFaultyConn, err error) error {
				return fmt.Errorf("read tcp: %w", os.ErrDeadlineExceeded)
			})},
			caught: []string{"Transport/Deadline/ReadCancelled", "Transport/Deadline/ReadExpires", "Transport/Deadline/ReadResumes"},
			says: [][2]string{
				{"Transport/Deadline/ReadCancelled", "want ctx's error"},
				{"Transport/Deadline/ReadExpires", "want ctx's error"},
				{"Transport/Deadline/ReadResumes", "an interrupted ReadFrame must leave the connection usable"},
			},
		},
		{
			// A read interrupted mid-frame cannot resume, so the
			// transport gives the connection up.
			name: "ReadDeadlineKillsTheConnection",
			faults: transportFaults{read: transportOnContextEnd(func(c *transportFaultyConn, err error) error {
				c.Conn.Close()
				return err
			})},
			caught: []string{"Transport/Deadline/ReadCancelled", "Transport/Deadline/ReadExpires", "Transport/Deadline/ReadResumes"},
			says: [][2]string{
				{"Transport/Deadline/ReadCancelled", "the connection must stay usable"},
				{"Transport/Deadline/ReadExpires", "the connection must stay usable"},
				{"Transport/Deadline/ReadResumes", "an interrupted ReadFrame must leave the connection usable"},
			},
		},
		{
			// Err reports a keepalive probe not answered yet, though the
			// connection lives on: the kernel takes any Err for death.
			name: "ErrReportsAnUnansweredProbe",
			faults: transportFaults{err: func(c *transportFaultyConn) error {
				if err := c.Conn.Err(); err != nil {
					return err
				}
				if time.Since(time.Unix(0, c.active.Load())) > 100*time.Millisecond {
					return errors.New("broken: keepalive probe unanswered for 100ms")
				}
				return nil
			}},
			caught: []string{"Transport/Idle/Unused"},
			says:   [][2]string{{"Transport/Idle/Unused", "has an error at the client end: broken: keepalive probe unanswered"}},
		},
		{
			// A writer that takes a socket silent for 100ms for stale
			// and writes the next frame into a new one nobody reads.
			name:   "LosesTheFirstFrameAfterAnIdleSpell",
			faults: transportAfterIdle(100 * time.Millisecond),
			caught: []string{"Transport/Idle/Unused", "Transport/Idle/AwaitingAnswer"},
			says: [][2]string{
				{"Transport/Idle/Unused", "was it lost?"},
				{"Transport/Idle/AwaitingAnswer", "did not arrive within"},
			},
		},
		{
			name: "AcceptTimesOutWithItsOwnError",
			faults: transportFaults{accept: transportAcceptFailing(func(ctx context.Context, err error) error {
				if ctx.Err() != nil {
					return errors.New("accept tcp: i/o timeout")
				}
				return err
			})},
			caught: []string{"Transport/Deadline/Accept"},
			says:   [][2]string{{"Transport/Deadline/Accept", "want ctx's error"}},
		},
	}
}

// transportAtTheEnd is a ReadFrame that returns end's outcome instead of
// the error that says the connection is over, closed here or by the peer.
func transportAtTheEnd(end func() (*kernel.Frame, error)) func(context.Context, *transportFaultyConn) (*kernel.Frame, error) {
	return func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
		f, err := c.Conn.ReadFrame(ctx)
		if errors.Is(err, kernel.ErrClosed) || errors.Is(err, kernel.ErrPeerGone) {
			return end()
		}
		return f, err
	}
}

// transportAfterIdle drops the first frame a connection writes after
// idle without a frame read or written.
func transportAfterIdle(idle time.Duration) transportFaults {
	var last sync.Map // *transportFaultyConn → time.Time of its last frame
	return transportFaults{
		read: func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
			f, err := c.Conn.ReadFrame(ctx)
			if err == nil {
				last.Store(c, time.Now())
			}
			return f, err
		},
		write: func(c *transportFaultyConn, f *kernel.Frame) error {
			now := time.Now()
			if prev, ok := last.Swap(c, now); ok && now.Sub(prev.(time.Time)) > idle {
				c.Conn.Recycle(f.Payload)
				return nil
			}
			return c.Conn.WriteFrame(f)
		},
	}
}

// transportAcceptFailing is an Accept that fails with fail's error where
// the listener's Accept failed.
func transportAcceptFailing(fail func(ctx context.Context, err error) error) func(context.Context, *transportFaultyListener) (kernel.Conn, error) {
	return func(ctx context.Context, l *transportFaultyListener) (kernel.Conn, error) {
		c, err := l.Listener.Accept(ctx)
		if err != nil {
			return nil, fail(ctx, err)
		}
		return l.tr.wrap(c), nil
	}
}

// transportOnContextEnd is a ReadFrame that returns fail's error, and does
// what fail does, when its context ends the read.
func transportOnContextEnd(fail func(c *transportFaultyConn, err error) error) func(context.Context, *transportFaultyConn) (*kernel.Frame, error) {
	return func(ctx context.Context, c *transportFaultyConn) (*kernel.Frame, error) {
		f, err := c.Conn.ReadFrame(ctx)
		if err != nil && ctx.Err() != nil {
			return nil, fail(c, err)
		}
		return f, err
	}
}

// transportConcurrencyCases are broken transports that take one
// operation at a time where the kernel makes many at once.
func transportConcurrencyCases() []transportCase {
	return []transportCase{
		{
			// A connection that refuses a second writer, as a websocket
			// library does, instead of queueing it. The writer holding
			// the flag yields, as a loaded machine lets another in.
			name: "WriteFrameRefusesASecondWriter",
			faults: transportFaults{write: func() func(c *transportFaultyConn, f *kernel.Frame) error {
				var busy sync.Map // per connection
				return func(c *transportFaultyConn, f *kernel.Frame) error {
					flag, _ := busy.LoadOrStore(c, new(atomic.Bool))
					held := flag.(*atomic.Bool)
					if !held.CompareAndSwap(false, true) {
						c.Conn.Recycle(f.Payload)
						return errors.New("broken: concurrent write to connection")
					}
					defer held.Store(false)
					runtime.Gosched()
					return c.Conn.WriteFrame(f)
				}
			}()},
			caught: []string{"Transport/Concurrent/Calls"},
			says:   [][2]string{{"Transport/Concurrent/Calls", "WriteFrame: broken: concurrent write to connection"}},
		},
	}
}
