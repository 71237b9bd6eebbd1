package etcdtest

import (
	"crypto/x509"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/testpki"
	"github.com/kernrpc/kernrpc/kernel"
)

// With nothing listening at the endpoint, the error says so, after
// dial_timeout, rather than only that etcd did not answer.
func TestNothingListeningIsNamed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := open(t, addr, map[string]any{"dial_timeout": "300ms"})
	_, err = r.Resolve(ctxFor(t), "echo")
	if err == nil || !strings.Contains(err.Error(), "within dial_timeout 300ms ("+addr+": is etcd running there? dial tcp "+addr+": connect: connection refused)") {
		t.Errorf("Resolve with nothing at %s: %v", addr, err)
	}
}

// The registry's tls option reaches an etcd that serves its clients over
// TLS and asks each for a certificate: with the CA and a client
// certificate it registers and resolves; without the certificate, or
// trusting another CA, it fails within dial_timeout saying so.
func TestRegistryOverTLS(t *testing.T) {
	ca := testpki.New(t, "ca")
	serverCert, serverKey := ca.Issue(t, "etcd", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.Issue(t, "kernrpc", x509.ExtKeyUsageClientAuth)
	srv := StartTLS(t, TLSFiles{CertFile: serverCert, KeyFile: serverKey, CAFile: ca.File})

	r := open(t, srv.Endpoint(), map[string]any{"tls": map[string]any{"ca_file": ca.File, "cert_file": clientCert, "key_file": clientKey}})
	if err := r.Register(ctxFor(t), instance("echo", "a"), 0); err != nil {
		t.Fatalf("Register over TLS with a client certificate: %v", err)
	}
	set, err := r.Resolve(ctxFor(t), "echo")
	if err != nil || len(set) != 1 || set[0].ID != "a" {
		t.Fatalf("Resolve over TLS: %v, %v; want instance a", set, err)
	}

	other := testpki.New(t, "other-ca")
	for _, tc := range []struct {
		name string
		tls  map[string]any
		want string
	}{
		{"no client certificate", map[string]any{"ca_file": ca.File}, "TLS: the server refused the connection: remote error: tls: certificate required"},
		{"another CA trusted", map[string]any{"ca_file": other.File, "cert_file": clientCert, "key_file": clientKey}, "TLS handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
	} {
		bad := open(t, srv.Endpoint(), map[string]any{"tls": tc.tls, "dial_timeout": "500ms"})
		start := time.Now()
		err := bad.Register(ctxFor(t), instance("echo", "b"), 0)
		if err == nil || !strings.Contains(err.Error(), "no answer from etcd at "+srv.Endpoint()+" within dial_timeout 500ms ("+srv.Endpoint()+": "+tc.want+")") {
			t.Errorf("Register with %s: %v; want the handshake's failure named: %s", tc.name, err, tc.want)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("Register with %s took %s to fail", tc.name, took)
		}
	}
	if _, err := kernel.NewRegistry("etcd", map[string]any{"endpoints": []any{srv.Endpoint()}, "tls": map[string]any{"ca_file": filepath.Join(t.TempDir(), "missing.pem")}}, "test.yaml"); err == nil || !strings.Contains(err.Error(), `option "tls": ca_file`) {
		t.Errorf("a tls ca_file that does not exist: %v", err)
	}
}
