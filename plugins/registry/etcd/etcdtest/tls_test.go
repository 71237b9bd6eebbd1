package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// authority is a certificate authority made for one test.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // its certificate, PEM
}

func newAuthority(t *testing.T, dir, name string) *authority {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	a := &authority{cert: cert, key: key, file: filepath.Join(dir, name+".pem")}
	writePEM(t, a.file, "CERTIFICATE", der)
	return a
}

// issue writes a certificate for 127.0.0.1 that a signed, usable by a
// server and a client, and its key; it returns their files.
func (a *authority) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

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
	dir := t.TempDir()
	ca := newAuthority(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, dir, "etcd")
	clientCert, clientKey := ca.issue(t, dir, "kernrpc")
	srv := StartTLS(t, TLSFiles{CertFile: serverCert, KeyFile: serverKey, CAFile: ca.file})

	r := open(t, srv.Endpoint(), map[string]any{"tls": map[string]any{"ca_file": ca.file, "cert_file": clientCert, "key_file": clientKey}})
	if err := r.Register(ctxFor(t), instance("echo", "a"), 0); err != nil {
		t.Fatalf("Register over TLS with a client certificate: %v", err)
	}
	set, err := r.Resolve(ctxFor(t), "echo")
	if err != nil || len(set) != 1 || set[0].ID != "a" {
		t.Fatalf("Resolve over TLS: %v, %v; want instance a", set, err)
	}

	other := newAuthority(t, dir, "other-ca")
	for _, tc := range []struct {
		name string
		tls  map[string]any
		want string
	}{
		{"no client certificate", map[string]any{"ca_file": ca.file}, "TLS: the server refused the connection: remote error: tls: certificate required"},
		{"another CA trusted", map[string]any{"ca_file": other.file, "cert_file": clientCert, "key_file": clientKey}, "TLS handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
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
	if _, err := kernel.NewRegistry("etcd", map[string]any{"endpoints": []any{srv.Endpoint()}, "tls": map[string]any{"ca_file": filepath.Join(dir, "missing.pem")}}, "test.yaml"); err == nil || !strings.Contains(err.Error(), `option "tls": ca_file`) {
		t.Errorf("a tls ca_file that does not exist: %v", err)
	}
}
