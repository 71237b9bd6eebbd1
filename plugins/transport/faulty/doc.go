// Package faulty is a transport for tests that wraps another transport by
// name and makes it misbehave: it delays, drops, duplicates, corrupts and
// truncates frames, resets connections, stops writing, or swallows
// everything, from its options and deterministically by seed. Its config
// name is "faulty"; addresses are those of the wrapped transport. Users put
// it in their own test configs:
//
//	transport:
//	  name: faulty
//	  options:
//	    transport: {name: tcp-lv, options: {max_frame_size: 1MiB}}
//	    side: dial
//	    drop: 0.05
//
// Options and their defaults (every fault is off by default, and the
// wrapped transport's connections are then handed out unwrapped):
//
//	transport      {name: tcp-lv}  the transport wrapped, by name, with its
//	                               options; built through the kernel's
//	                               plugin table, so it must be registered
//	seed           1               seeds each connection's generator (with
//	                               its side and number), so a run repeats
//	                               its faults; concurrent writers still
//	                               interleave as the scheduler decides
//	side           both            whose writes the faults hit: dial (the
//	                               client's requests), listen (the server's
//	                               answers) or both
//	frames         [request, response, cancel]
//	                               the frame types affected, of request,
//	                               response, cancel, goaway, stream_data,
//	                               window_update; others pass
//	delay          0s              every affected frame is held back this
//	delay_jitter   0s              long plus up to delay_jitter at random;
//	                               frames keep their order, as on a stream
//	drop           0               probability that an affected frame is lost
//	duplicate      0               ... that it is sent twice
//	corrupt        0               ... that one byte of it is flipped
//	corrupt_in     payload         payload: the receiver gets the header
//	                               intact and the payload damaged; frame:
//	                               a byte anywhere in the frame as a byte
//	                               stream carries it, length prefix and
//	                               header included; the receiver gets what
//	                               those bytes decode to (another call id,
//	                               type, flag or method), and when they do
//	                               not decode the connection closes, as a
//	                               receiver closes it on a malformed frame
//	truncate       0               ... that its payload is cut short
//	reset          0               ... that the connection resets instead of
//	                               sending it
//	reset_after    0               reset instead of sending the affected
//	                               frame after this many (0: never)
//	stall_after    0               after this many affected frames the
//	                               connection stops writing: every later
//	                               frame is accepted and never leaves, as
//	                               when the peer stops reading; the peer's
//	                               deadlines and limits must end what waits
//	blackhole      false           the side's connections are made and
//	                               accepted, take every frame and never
//	                               send or deliver one
//
// A stream relies on its transport to deliver each frame once and in
// order, as kernel.Conn requires: drop or duplicate on stream_data shows
// the application a message missing from a stream or read twice, which
// the engine does not detect.
//
// Faults act on the frames a connection writes; what it reads passes
// through (a blackhole excepted), so the peer is the one that sees them.
// A reset closes the wrapped connection (its peer sees it end) and fails
// the write that triggered it with an error wrapping kernel.ErrPeerGone:
// nothing of that frame was sent. Ping and Pong frames never leave the
// wrapped transport, so its keepalive sees a healthy peer under a stall or
// a blackhole: as with a hung server, only deadlines end the calls.
//
// WriteFrame never waits: a delayed frame is sent later by a goroutine of
// the connection's own, a stalled or swallowed one is given back to the
// wrapped transport at once. So no fault can make a call outlast its
// deadline; a call without one waits as long as the fault lasts.
// CloseWrite sends the frames still held back first, then half-closes;
// a frame written after it, or after Close, fails with an error wrapping
// kernel.ErrClosed, delayed or not, and draws no fault (no reset).
//
// Memory: Buffer and Recycle are the wrapped connection's, and so is
// LendsMemory. A frame that is dropped, stalled or corrupted into new
// bytes has its payload recycled; a duplicate is copied into a buffer of
// the wrapped connection before the first copy is written, since the
// transport owns a payload once it has it. Read payloads are the wrapped
// transport's, released through it. A wrapped connection offers
// BufferedReader, FrameQueuer and HalfCloser when the connection it wraps
// does, and no others: not kernel.ContextWriter, so a write through it on
// shm-ring waits for room up to wait_timeout whatever the call's deadline.
package faulty
