package etcd

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strings"
	"time"
)

// probeTimeout bounds each endpoint's probe: it runs only once a request
// has already waited dial_timeout.
const probeTimeout = time.Second

// probe says why no endpoint took a connection, dialling each as the etcd
// client does, or "" when one did (the trouble is then past the
// connection). The client retries a failed connection quietly until the
// request's deadline, so without a probe a refused TLS handshake would
// read as an etcd that does not answer.
func (r *Registry) probe() string {
	timeout := min(r.opts.DialTimeout.D(), probeTimeout)
	var whys []string
	for _, ep := range r.opts.Endpoints {
		why := probeEndpoint(ep, r.cfg.TLS, timeout)
		if why == "" {
			return ""
		}
		whys = append(whys, ep+": "+why)
	}
	return strings.Join(whys, "; ")
}

func probeEndpoint(ep string, tc *tls.Config, timeout time.Duration) string {
	host, ok := strings.CutPrefix(ep, "http://")
	if !ok {
		host, _ = strings.CutPrefix(ep, "https://")
	}
	if strings.Contains(host, "://") {
		return "" // a unix socket, say: not probed
	}
	c, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return "is etcd running there? " + err.Error()
	}
	defer c.Close()
	if tc == nil {
		return ""
	}
	if tc.ServerName == "" && !tc.InsecureSkipVerify {
		tc = tc.Clone()
		tc.ServerName, _, _ = net.SplitHostPort(host)
	}
	tlsc := tls.Client(c, tc)
	_ = tlsc.SetDeadline(time.Now().Add(timeout))
	if err := tlsc.Handshake(); err != nil {
		return "TLS handshake failed: " + err.Error()
	}
	// With TLS 1.3 a server refuses the client's certificate (or its
	// absence) only after the client's side of the handshake is done: the
	// refusal is what the first read gets. etcd sends nothing first, so a
	// read that times out means the connection was taken.
	_ = tlsc.SetReadDeadline(time.Now().Add(timeout / 4))
	if _, err := tlsc.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return "TLS: the server refused the connection: " + err.Error()
	}
	return ""
}
