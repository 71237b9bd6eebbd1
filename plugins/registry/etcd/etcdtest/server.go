// Package etcdtest runs a real etcd inside the test process, for the etcd
// registry plugin's tests: embed.StartEtcd on loopback ports, a temporary
// data directory, ticks of 10ms so that it is ready in tens of
// milliseconds, and a silent logger. It is a module of its own, never
// released, so that neither the core nor the plugin module requires
// go.etcd.io/etcd/server.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is one embedded etcd member, a cluster of its own. It can be
// stopped and started again on the same data directory and ports, as a
// restarted etcd would be.
type Server struct {
	t       testing.TB
	dir     string
	client  url.URL
	peer    url.URL
	e       *embed.Etcd
	started int       // how many times it has started
	tls     *TLSFiles // nil: plain TCP
}

// TLSFiles are the PEM files of a member that serves its clients over TLS
// and asks each for a certificate signed by CAFile.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// Start starts an etcd member for t on free loopback ports and a fresh
// data directory; it is stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// StartTLS is Start for a member whose clients must speak TLS and show a
// certificate that files.CAFile signed.
func StartTLS(t testing.TB, files TLSFiles) *Server {
	t.Helper()
	return start(t, &files)
}

func start(t testing.TB, files *TLSFiles) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), client: freeURL(t), peer: freeURL(t), tls: files}
	if files != nil {
		s.client.Scheme = "https"
	}
	s.StartAgain()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the member's client address, host:port.
func (s *Server) Endpoint() string { return s.client.Host }

// StartAgain starts the member on its data directory and ports (after
// Stop). It fails t if the member is not ready within 10s.
func (s *Server) StartAgain() {
	s.t.Helper()
	if s.e != nil {
		s.t.Fatalf("etcdtest: StartAgain of a running server")
	}
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.client}
	cfg.AdvertiseClientUrls = []url.URL{s.client}
	cfg.ListenPeerUrls = []url.URL{s.peer}
	cfg.AdvertisePeerUrls = []url.URL{s.peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if s.tls != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: s.tls.CertFile, KeyFile: s.tls.KeyFile, TrustedCAFile: s.tls.CAFile, ClientCertAuth: true}
	}
	// Small ticks: a member elects itself in tens of milliseconds, and
	// leases as short as one second are allowed.
	cfg.TickMs = 10
	cfg.ElectionMs = 50
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.LogLevel = "error"
	var (
		e   *embed.Etcd
		err error
	)
	// A port freed by Stop may linger a moment in the kernel.
	for attempt := 0; ; attempt++ {
		e, err = embed.StartEtcd(cfg)
		if err == nil || attempt == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("etcdtest: start etcd in %s: %v", s.dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(10 * time.Second):
		e.Close()
		s.t.Fatalf("etcdtest: etcd in %s not ready after 10s", s.dir)
	}
	s.e = e
	s.started++
}

// Stop stops the member, keeping its data directory; it may be called
// again.
func (s *Server) Stop() {
	if s.e == nil {
		return
	}
	s.e.Close()
	<-s.e.Server.StopNotify()
	s.e = nil
}

// Wipe stops the member and starts it again at the same ports on a fresh,
// empty data directory: a cluster lost and built anew (disaster recovery),
// whose revision starts again from 1 while its clients run on.
func (s *Server) Wipe() {
	s.t.Helper()
	s.Stop()
	s.dir = s.t.TempDir()
	s.StartAgain()
}

// Backup stops the member, copies its data directory, starts it again,
// and returns the copy, for RestoreBackup.
func (s *Server) Backup() string {
	s.t.Helper()
	s.Stop()
	backup := s.t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(s.dir)); err != nil {
		s.t.Fatalf("etcdtest: back up %s: %v", s.dir, err)
	}
	s.StartAgain()
	return backup
}

// RestoreBackup stops the member and starts it again at the same ports on
// a copy of backup (from Backup): a cluster restored from an older backup,
// whose revision goes back to the backup's while its clients run on.
func (s *Server) RestoreBackup(backup string) {
	s.t.Helper()
	s.Stop()
	s.dir = s.t.TempDir()
	if err := os.CopyFS(s.dir, os.DirFS(backup)); err != nil {
		s.t.Fatalf("etcdtest: restore %s: %v", backup, err)
	}
	s.StartAgain()
}

// Version is the version of the etcd server embedded.
func Version() string { return version.Version }

// freeURL returns http://127.0.0.1:PORT for a port nobody listens on now.
func freeURL(t testing.TB) url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: find a free port: %v", err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)}
}
