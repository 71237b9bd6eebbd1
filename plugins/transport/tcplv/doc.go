// Package tcplv is the tcp-lv transport, kernrpc's default: kernel frames
// (length-value, see docs/protocol.md) over TCP, optionally TLS. Its config
// name is "tcp-lv" and addresses are host:port.
//
//	transport:
//	  name: tcp-lv
//	  options:
//	    max_frame_size: 4MiB
//	    tls: {cert_file: server.pem, key_file: server.key}
//
// Options and their defaults:
//
//	max_frame_size      4MiB   largest frame length read or written; a peer that
//	                           announces a longer frame is disconnected before
//	                           anything is allocated for it; a longer frame
//	                           written is refused alone, with ResourceExhausted
//	keepalive_interval  10s    how long a waiting reader hears nothing before a
//	                           Ping is sent; also the OS TCP keepalive's idle
//	                           time and probe interval, at most 32767s (9.1h,
//	                           Linux's largest; its probe count is the
//	                           system's, net.ipv4.tcp_keepalive_probes)
//	keepalive_timeout   5s     how long after that Ping the peer has to send
//	                           anything before the connection is declared dead
//	write_timeout       30s    a peer that does not drain its socket for this
//	                           long (at most 1.5 × as long) kills the
//	                           connection; a write with a context
//	                           (WriteFrameContext) returns sooner when it
//	                           ends, and the connection sends the rest
//	read_buffer_size    8KiB   per-connection read buffer
//	max_metadata_entries 256   metadata pairs one frame may carry; a frame
//	                           written with more is refused alone, with
//	                           ResourceExhausted; one read with more closes
//	                           the connection
//	max_metadata_bytes  64KiB  the same for the keys and values together
//	frame_timeout       10s    how long a frame may take to arrive whole
//	                           once its first byte has; a peer that stops
//	                           half way, or trickles, is cut off
//	first_frame_timeout 10s    how long an accepted connection may stay
//	                           silent before its first frame; then it gets
//	                           a GoAway ("first_frame_timeout", last call
//	                           0: the client sends its calls there again)
//	                           and is closed
//	max_write_queue     32MiB  bytes queued for a peer that is not reading
//	                           before it is cut off (at least twice
//	                           max_frame_size); only that peer suffers
//	min_ping_interval   1s     Pings closer together than this, with no other
//	                           frame between, more than twice in a row get a
//	                           GoAway ("too_many_pings") and the connection
//	                           closed; 0 means half of keepalive_interval, at
//	                           most 1s. A Ping payload over 64 bytes is a
//	                           protocol error
//	tls                 none   TLS on both sides when set:
//	  cert_file, key_file        this side's certificate (required to listen;
//	                             sent as the client certificate when dialing)
//	  ca_file                    CAs that verify the server (client side;
//	                             default: the system roots)
//	  client_ca_file             CAs that verify client certificates (server side)
//	  require_client_cert  false refuse clients without a certificate signed by
//	                             client_ca_file
//	  server_name                name expected in the server's certificate
//	                             (default: the host of the dialed address)
//	  insecure_skip_verify false do not verify the server's certificate
//
// Every timeout and interval above must be at least 1ms (min_ping_interval
// may also be 0, for its default): below that, each connection would fail
// at its first wait. The timeouts and keepalive's two may be at most 100
// years (876000h), which is as good as never: the deadlines derived from
// longer ones would overflow.
//
// A plain TCP connection on Linux, whose socket is written with raw
// system calls, is a kernel.ContextWriter; a TLS one is not (a TLS write
// cannot stop midway and resume), nor is one elsewhere. A write whose
// context ends while it waits for the peer to drain the socket returns
// nil then: part of its frame may be out, so what is left, copied, goes
// out on a goroutine of the connection, ahead of every frame written
// later, under the deadline its write had: a peer that drains nothing is
// still cut off within 1.5 × write_timeout of that write. The engine
// writes a call's request with the call's context, so a call to a server
// that stopped reading returns at its deadline, not write_timeout later.
//
// Nobody reads a client's connection while no call waits on it, so a
// server that dies meanwhile leaves its close unread (behind the late
// answer of a call that gave up, perhaps). A request written 10ms or more
// after the last, with nobody reading, therefore looks first, with one
// system call: on Linux at the socket's TCP state (any close or half-close
// from the peer, even behind bytes still unread: a draining server serves
// no request after its FIN), on macOS with a peek (a close with nothing
// unread before it). Finding one, the request is not sent, and the write
// fails with ErrPeerGone, which the engine takes as a call never sent and
// sends again on a new connection.
//
// A TLS handshake must finish within keepalive_interval + keepalive_timeout;
// each runs on a goroutine of its own, so a client that stalls in its
// handshake holds up no other. A failed handshake is logged at WARN, unless
// the client hung up (a dial its caller gave up, a TCP health check):
// that is routine, and logged at DEBUG.
//
// Writes hand no work to another goroutine when the connection is idle: the
// caller of WriteFrame writes its frame itself. When a write is in flight the
// frame is queued, and whoever writes next (the per-connection writer
// goroutine, or a caller that finds the connection free) sends the whole
// queue in one write or writev. A caller that writes the queue writes its
// own frame last (frames queued meanwhile wait for the next write), so
// that a write that fails says truly that the caller's frame did not reach
// the peer whole: the engine sends such a call again elsewhere. While the
// reader works through frames it has already received (a burst of
// answers, say), the requests their callers write meanwhile, and answers
// queued with QueueFrame, wait in the
// queue: the writer goroutine sends them together once no whole frame is
// left unread. Other frames (Cancel, GoAway, Ping) never wait. At 64
// callers this cut the client's write calls per call from 0.54 to about
// 0.15 and the CPU per call on both sides by half.
// The writer goroutine never waits for the queue's lock: finding it held,
// it leaves the queue for its next wake-up, which the holder, a caller
// queueing a frame, gives it on letting go. Spinning for the lock while a
// stream's sender appended its messages had cost 14% of the time per
// message of a 16 B stream.
//
// On Linux, a connection without TLS reads and writes its socket with raw
// read(2) and writev(2) calls, waiting through the runtime's poller (and
// its deadlines) only when the socket is empty or full. net.Conn would
// enter the scheduler's syscall state around each call, and a process
// whose every P was idle (a client waiting for its answers) then wakes
// the runtime's monitor thread, which polls every 20 µs for a millisecond
// or more: 16 client processes of one server on two cores spent 28% of
// their CPU there. Reading and writing raw, they did 1.7× the calls/s,
// each client spending about half the CPU a call. TLS connections, and other systems,
// go through net.Conn.
//
// Keepalive probes only when the connection waits for an answer: a ReadFrame
// is blocked and requests written outnumber responses read. An idle client
// may have nobody reading (the engine reads a connection that carried two
// requests once it idled 100 ms), and cannot answer Pings then; so a
// server, whose read loop always waits for the next request, never probes
// and never declares an idle client dead (the OS TCP keepalive and
// write_timeout cover vanished clients), and a client with no call waiting
// sends no Pings. The timer that drives it comes with the first request a
// connection writes, so a server's connections have none.
//
// A frame's buffer grows with the bytes that arrive, not with the length
// announced: up to 64.5KiB at first, then doubling, so a peer announcing
// the maximum and sending nothing costs 64KiB, not 4MiB. docs/reliability.md
// lists every limit with its test.
//
// Buffers from Buffer and the payloads of frames from ReadFrame come from
// free lists and are reused after WriteFrame, Recycle and Release, so
// steady traffic allocates nothing. Buffers up to 32KiB come from the
// connection's own lists (about 1MiB a size class); larger ones from lists
// that all connections of the transport share (about 16MiB a size class,
// from 64KiB to 1MiB), since a connection moving large messages on many
// streams or calls has dozens out at once. A list keeps no more buffers
// than were once out together, within those bounds, and gives back, about
// once a second after a GC cycle, those it had no use for since the last
// time: a burst's buffers go back to the collector once it is over.
package tcplv
