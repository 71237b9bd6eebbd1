package etcd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/etcd"
)

// deadEndpoint is a loopback address nobody listens on.
func deadEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestDeadEtcdFailsWithinDialTimeout: with no etcd at the endpoint, the
// registry builds, and every call that needs etcd fails clearly once
// dial_timeout has passed, instead of hanging.
func TestDeadEtcdFailsWithinDialTimeout(t *testing.T) {
	const dialTimeout = 300 * time.Millisecond
	endpoint := deadEndpoint(t)
	for _, tc := range []struct {
		name    string
		options map[string]any
		call    func(context.Context, *etcd.Registry) error
	}{
		{"Resolve", nil, func(ctx context.Context, r *etcd.Registry) error {
			_, err := r.Resolve(ctx, "svc")
			return err
		}},
		{"Watch", nil, func(ctx context.Context, r *etcd.Registry) error {
			_, err := r.Watch(ctx, "svc")
			return err
		}},
		{"Register", nil, func(ctx context.Context, r *etcd.Registry) error {
			return r.Register(ctx, kernel.Instance{Service: "svc", ID: "a", Address: "127.0.0.1:1"}, 0)
		}},
		{"Deregister", nil, func(ctx context.Context, r *etcd.Registry) error {
			return r.Deregister(ctx, kernel.Instance{Service: "svc", ID: "a"})
		}},
		{"Campaign", nil, func(ctx context.Context, r *etcd.Registry) error {
			_, err := r.Campaign(ctx, "e", "a")
			return err
		}},
		{"Leader", nil, func(ctx context.Context, r *etcd.Registry) error {
			_, err := r.Leader(ctx, "e")
			return err
		}},
		// With credentials the client authenticates as it is built.
		{"Resolve with username", map[string]any{"username": "u", "password": "p"}, func(ctx context.Context, r *etcd.Registry) error {
			_, err := r.Resolve(ctx, "svc")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := map[string]any{"endpoints": []any{endpoint}, "dial_timeout": dialTimeout.String()}
			for k, v := range tc.options {
				opts[k] = v
			}
			reg, err := kernel.NewRegistry(etcd.Name, opts, "svc.yaml")
			if err != nil {
				t.Fatalf("NewRegistry with a dead endpoint: %v; want it built (it dials on first use)", err)
			}
			defer reg.Close()
			start := time.Now()
			err = tc.call(context.Background(), reg.(*etcd.Registry))
			t.Logf("%s: %v (after %s)", tc.name, err, time.Since(start).Round(time.Millisecond))
			took := time.Since(start)
			if err == nil {
				t.Fatalf("%s with no etcd at %s succeeded", tc.name, endpoint)
			}
			if took < dialTimeout/2 || took > dialTimeout+2*time.Second {
				t.Errorf("%s failed after %s; want about dial_timeout %s", tc.name, took, dialTimeout)
			}
			for _, want := range []string{"etcd", endpoint, "dial_timeout " + dialTimeout.String()} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %q does not wrap context.DeadlineExceeded", err)
			}
		})
	}
}

// TestCallerDeadlineBeforeDialTimeout: a caller's own deadline, shorter
// than dial_timeout, ends the call at that deadline, and says so.
func TestCallerDeadlineBeforeDialTimeout(t *testing.T) {
	reg, err := kernel.NewRegistry(etcd.Name, map[string]any{"endpoints": []any{deadEndpoint(t)}, "dial_timeout": "10s"}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = reg.Resolve(ctx, "svc")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Resolve with a 200ms deadline and no etcd: %v; want the deadline's error", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Resolve took %s; the caller's 200ms deadline should end it", took)
	}
	if strings.Contains(err.Error(), "dial_timeout") {
		t.Errorf("error %q blames dial_timeout; the caller's deadline ended the call", err)
	}
}

// TestClosed: calls after Close fail with kernel.ErrClosed.
func TestClosed(t *testing.T) {
	reg, err := kernel.NewRegistry(etcd.Name, map[string]any{"endpoints": []any{deadEndpoint(t)}}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Close(); err != nil {
		t.Fatalf("Close of an unused registry: %v", err)
	}
	ctx := context.Background()
	r := reg.(*etcd.Registry)
	_, errResolve := r.Resolve(ctx, "svc")
	_, errWatch := r.Watch(ctx, "svc")
	errRegister := r.Register(ctx, kernel.Instance{Service: "svc", ID: "a", Address: "x"}, 0)
	errLoad := r.ReportLoad(ctx, kernel.Instance{Service: "svc", ID: "a"}, kernel.Load{})
	_, errCampaign := r.Campaign(ctx, "e", "a")
	for name, err := range map[string]error{"Resolve": errResolve, "Watch": errWatch, "Register": errRegister, "ReportLoad": errLoad, "Campaign": errCampaign} {
		if !errors.Is(err, kernel.ErrClosed) {
			t.Errorf("%s after Close: %v; want kernel.ErrClosed", name, err)
		}
	}
}

// TestBadCalls: what the key layout cannot hold is refused up front.
func TestBadCalls(t *testing.T) {
	reg, err := kernel.NewRegistry(etcd.Name, map[string]any{"endpoints": []any{deadEndpoint(t)}}, "svc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		says string
	}{
		{"service with a slash", reg.Register(ctx, kernel.Instance{Service: "a/b", ID: "x", Address: "y"}, 0), "must not contain '/'"},
		{"empty service", reg.Register(ctx, kernel.Instance{ID: "x", Address: "y"}, 0), "empty service"},
		{"empty ID", reg.Register(ctx, kernel.Instance{Service: "a", Address: "y"}, 0), "empty ID"},
		{"empty address", reg.Register(ctx, kernel.Instance{Service: "a", ID: "x"}, 0), "empty Address"},
		{"negative ttl", reg.Register(ctx, kernel.Instance{Service: "a", ID: "x", Address: "y"}, -time.Second), "negative ttl"},
		{"resolve with a slash", func() error { _, err := reg.Resolve(ctx, "a/b"); return err }(), "must not contain '/'"},
		{"load of an unregistered instance", reg.(*etcd.Registry).ReportLoad(ctx, kernel.Instance{Service: "a", ID: "x"}, kernel.Load{}), "has not registered it"},
		{"campaign without a name", func() error { _, err := reg.(*etcd.Registry).Campaign(ctx, "", "a"); return err }(), "empty election name"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.says) {
			t.Errorf("%s: %v; want an error saying %q", tc.name, tc.err, tc.says)
		}
	}
}

// TestCallerDeadlineBehindAnotherWrite: a Register or Deregister that
// waits behind another write of the same registry's instances (here a
// Register that waits out dial_timeout for a dead etcd) ends at its own
// deadline, not once the other write has given up.
func TestCallerDeadlineBehindAnotherWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(context.Context, kernel.Registry) error
	}{
		{"Register", func(ctx context.Context, reg kernel.Registry) error {
			return reg.Register(ctx, kernel.Instance{Service: "svc", ID: "b", Address: "127.0.0.1:2"}, 0)
		}},
		{"Deregister", func(ctx context.Context, reg kernel.Registry) error {
			return reg.Deregister(ctx, kernel.Instance{Service: "svc", ID: "b"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := kernel.NewRegistry(etcd.Name, map[string]any{"endpoints": []any{deadEndpoint(t)}, "dial_timeout": "3s"}, "svc.yaml")
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			first := make(chan error, 1)
			go func() {
				first <- reg.Register(context.Background(), kernel.Instance{Service: "svc", ID: "a", Address: "127.0.0.1:1"}, 0)
			}()
			// Time for the first Register to start its write; were it
			// slower, the call below would write first, and end at its
			// deadline anyway.
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = tc.call(ctx, reg)
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("%s with a 200ms deadline took %s: it waited for the other write", tc.name, took.Round(time.Millisecond))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s with a 200ms deadline behind a write waiting for a dead etcd: %v; want the deadline's error", tc.name, err)
			}
			if err := <-first; err == nil {
				t.Errorf("a Register with no etcd succeeded")
			}
		})
	}
}
