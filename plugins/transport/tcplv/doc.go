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
//	                           Ping is sent; also the OS TCP keepalive interval
//	keepalive_timeout   5s     how long after that Ping the peer has to send
//	                           anything before the connection is declared dead
//	write_timeout       30s    a peer that does not drain its socket for this
//	                           long kills the connection
//	read_buffer_size    64KiB  per-connection read buffer
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
// A TLS handshake must finish within keepalive_interval + keepalive_timeout;
// each runs on a goroutine of its own, so a client that stalls in its
// handshake holds up no other.
//
// Writes hand no work to another goroutine when the connection is idle: the
// caller of WriteFrame writes its frame itself. When a write is in flight the
// frame is queued, and whoever writes next (the per-connection writer
// goroutine, or a caller that finds the connection free) sends the whole
// queue in one write or writev. While the reader works through frames it
// has already received (a burst of answers, say), the requests their
// callers write meanwhile, and answers queued with QueueFrame, wait in the
// queue: the writer goroutine sends them together once no whole frame is
// left unread. Other frames (Cancel, GoAway, Ping) never wait. At 64
// callers this cut the client's write calls per call from 0.54 to about
// 0.15 and the CPU per call on both sides by half.
//
// Keepalive probes only when the connection waits for an answer: a ReadFrame
// is blocked and requests written outnumber responses read. An idle client,
// which has nobody reading, cannot answer Pings; so a server, whose read loop
// always waits for the next request, never probes and never declares an
// idle client dead (the OS TCP keepalive and write_timeout cover vanished
// clients), and a client with no call waiting sends no Pings.
//
// Buffers from Buffer and the payloads of frames from ReadFrame come from
// per-connection free lists and are reused after WriteFrame, Recycle and
// Release, so steady traffic allocates nothing.
package tcplv
