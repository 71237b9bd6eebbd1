package consultest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
)

// failFirstRegistration forwards to a stand-in agent, except for the
// first service registration: held is closed when it arrives, and once
// release is closed it is answered 500 without reaching the agent.
type failFirstRegistration struct {
	next          http.Handler
	held, release chan struct{}
	once          sync.Once
}

func (p *failFirstRegistration) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	first := false
	if r.Method == http.MethodPut && r.URL.Path == "/v1/agent/service/register" {
		p.once.Do(func() { first = true })
	}
	if !first {
		p.next.ServeHTTP(w, r)
		return
	}
	close(p.held)
	<-p.release
	http.Error(w, "agent busy", http.StatusInternalServerError)
}

// A Register of an instance that waits behind a first Register of the
// same instance, which then fails, is the one that counts: what it
// registered is this registry's, its check passed and deregistered at
// Close, not left behind untracked on the agent.
func TestRegisterBehindAFailedFirstRegisterIsKept(t *testing.T) {
	s := standIn(t, fast)
	target, err := url.Parse("http://" + s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p := &failFirstRegistration{next: httputil.NewSingleHostReverseProxy(target), held: make(chan struct{}), release: make(chan struct{})}
	hs := httptest.NewServer(p)
	t.Cleanup(hs.Close)
	r := open(t, strings.TrimPrefix(hs.URL, "http://"), nil)

	first := make(chan error, 1)
	go func() { first <- r.Register(ctx(t), instance("echo", "a"), 0) }()
	<-p.held
	second := make(chan error, 1)
	go func() { second <- r.Register(ctx(t), instance("echo", "a"), 0) }()
	// Time for the second Register to find the first one's registration
	// and wait behind it: were it slower, it would make a registration of
	// its own, and the test would pass without exercising anything.
	time.Sleep(200 * time.Millisecond)
	close(p.release)
	if err := <-first; err == nil {
		t.Fatal("the first Register succeeded; the agent answered 500")
	}
	if err := <-second; err != nil {
		t.Fatalf("the second Register: %v", err)
	}
	// Kept alive: still passing after several ttls (1s).
	time.Sleep(2500 * time.Millisecond)
	if !resolveIs(t, open(t, s.Addr(), nil), "echo", "a")() {
		t.Errorf("the instance the second Register registered is not passing after 2.5 ttls: its check is not passed")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	e, _, err := apiClient(t, s.Addr()).Health().Service("echo", "", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(e) != 0 {
		t.Errorf("%d instances on the agent after Close; want the one registered deregistered", len(e))
	}
}

// hangCheckPasses forwards to a stand-in agent; once hang is set, a check
// pass hangs until its client gives up, and entered is closed when the
// first one does.
type hangCheckPasses struct {
	next    http.Handler
	entered chan struct{}
	once    sync.Once

	mu   sync.Mutex
	hang bool
}

func (p *hangCheckPasses) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	hang := p.hang
	p.mu.Unlock()
	if hang && strings.HasPrefix(r.URL.Path, "/v1/agent/check/update/") {
		// Read to the end: only then does the server see the client
		// give up, and end r's context.
		io.Copy(io.Discard, r.Body)
		p.once.Do(func() { close(p.entered) })
		<-r.Context().Done()
		return
	}
	p.next.ServeHTTP(w, r)
}

// A Register, Deregister or ReportLoad of an instance whose check pass
// hangs (for up to the timeout option, 2s here) ends at its own deadline,
// not once the pass has given up.
func TestCallerDeadlineBehindAHangingCheckPass(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(context.Context, *consul.Registry) error
	}{
		{"Register", func(ctx context.Context, r *consul.Registry) error {
			return r.Register(ctx, instance("echo", "a"), 300*time.Millisecond)
		}},
		{"Deregister", func(ctx context.Context, r *consul.Registry) error { return r.Deregister(ctx, instance("echo", "a")) }},
		{"ReportLoad", func(ctx context.Context, r *consul.Registry) error {
			return r.ReportLoad(ctx, instance("echo", "a"), kernel.Load{InFlight: 1})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := standIn(t, fast)
			target, err := url.Parse("http://" + s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			p := &hangCheckPasses{next: httputil.NewSingleHostReverseProxy(target), entered: make(chan struct{})}
			hs := httptest.NewServer(p)
			t.Cleanup(hs.Close)
			r := open(t, strings.TrimPrefix(hs.URL, "http://"), nil)
			// A ttl of 300ms: the keeper passes the check every 100ms.
			if err := r.Register(ctx(t), instance("echo", "a"), 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			p.mu.Lock()
			p.hang = true
			p.mu.Unlock()
			<-p.entered
			c, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = tc.call(c, r)
			if took := time.Since(start); took > time.Second {
				t.Errorf("%s with a 200ms deadline took %s: it waited for the check pass", tc.name, took.Round(time.Millisecond))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s with a 200ms deadline behind a hanging check pass: %v; want the deadline's error", tc.name, err)
			}
		})
	}
}
