package plugintest

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
)

// transportOptionalCases break what tcp-lv's QueueFrame and CloseWrite
// promise (kernel.FrameQueuer, kernel.HalfCloser), which the suite checked
// for no transport before: a connection offering them passed whatever
// they did.
func transportOptionalCases() []transportCase {
	return []transportCase{
		{
			// Queued frames go out with the next WriteFrame only: the last
			// answer of a burst waits for a call that may never come.
			name: "QueueFrameWaitsForAWrite",
			faults: transportFaults{
				queue: func(c *transportFaultyConn, f *kernel.Frame) error {
					c.mu.Lock()
					c.held = append(c.held, f)
					c.mu.Unlock()
					return nil
				},
				write: func(c *transportFaultyConn, f *kernel.Frame) error {
					c.mu.Lock()
					held := c.held
					c.held = nil
					c.mu.Unlock()
					for _, h := range held {
						if err := c.Conn.WriteFrame(h); err != nil {
							return err
						}
					}
					return c.Conn.WriteFrame(f)
				},
			},
			caught: []string{"Transport/QueueFrame/Alone"},
			says:   [][2]string{{"Transport/QueueFrame/Alone", "and nothing written after it, did not arrive"}},
		},
		{
			// Queued frames jump ahead of those written before them.
			name: "QueueFrameOvertakesWrites",
			faults: transportFaults{
				queue: func(c *transportFaultyConn, f *kernel.Frame) error {
					c.mu.Lock()
					c.held = append(c.held, f)
					flush := len(c.held) == 2
					held := c.held
					if flush {
						c.held = nil
					}
					c.mu.Unlock()
					if !flush {
						return nil
					}
					for i := len(held) - 1; i >= 0; i-- {
						if err := c.Conn.WriteFrame(held[i]); err != nil {
							return err
						}
					}
					return nil
				},
			},
			caught: []string{"Transport/QueueFrame/InOrder"},
			says:   [][2]string{{"Transport/QueueFrame/InOrder", "a queued frame must go out before a frame written after it"}},
		},
		{
			// A WriteFrameContext that ignores its context: a call's
			// request waits on a peer that reads nothing past its deadline.
			name: "WriteFrameContextIgnoresItsContext",
			faults: transportFaults{writeContext: func(_ context.Context, c *transportFaultyConn, f *kernel.Frame) error {
				return c.WriteFrame(f)
			}},
			caught: []string{"Transport/ContextWrite"},
			says:   [][2]string{{"Transport/ContextWrite", "after its context was canceled"}},
		},
		{
			// A half-close that closes the read side too: the requests
			// racing a draining server's close are reset away.
			name:   "CloseWriteClosesBothWays",
			faults: transportFaults{closeWrite: func(c *transportFaultyConn) error { return c.Conn.Close() }},
			caught: []string{"Transport/HalfClose/ReadsOn"},
			says:   [][2]string{{"Transport/HalfClose/ReadsOn", "frames from the peer can still be read"}},
		},
		{
			// A half-close that tells the peer nothing: the client never
			// learns that the draining server is done.
			name:   "CloseWriteSendsNoEnd",
			faults: transportFaults{closeWrite: func(*transportFaultyConn) error { return nil }},
			caught: []string{"Transport/HalfClose/SendsThenEnds"},
			says:   [][2]string{{"Transport/HalfClose/SendsThenEnds", "CloseWrite must tell the peer that no more frames will come"}},
		},
		{
			// A half-close that shuts the socket before the queue is sent.
			name: "CloseWriteDropsTheQueue",
			faults: transportFaults{
				queue: func(c *transportFaultyConn, f *kernel.Frame) error {
					c.mu.Lock()
					c.held = append(c.held, f)
					c.mu.Unlock()
					return nil
				},
				closeWrite: func(c *transportFaultyConn) error {
					c.mu.Lock()
					c.held = nil
					c.mu.Unlock()
					return c.Conn.(kernel.HalfCloser).CloseWrite()
				},
			},
			caught: []string{"Transport/HalfClose/SendsThenEnds"},
			says:   [][2]string{{"Transport/HalfClose/SendsThenEnds", "written before CloseWrite, arrived as frame 2"}},
		},
	}
}
