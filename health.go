package kernrpc

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kernrpc/kernrpc/kernel"
)

// HealthCheckMethod is the health service every server serves, the way
// grpc.health.v1 works: the request names a service (a
// wrapperspb.StringValue; empty means the whole server), the answer is its
// HealthStatus as a wrapperspb.StringValue. A service the server does not
// serve is answered with NotFound. Any codec that encodes protobuf messages
// (protobuf, json, msgpack) can call it; Client.CheckHealth does.
const HealthCheckMethod = "kernrpc.Health.Check"

// HealthStatus is what the health service says of a service.
type HealthStatus string

// The health statuses, named as grpc.health.v1 names them.
const (
	HealthUnknown    HealthStatus = "UNKNOWN"
	HealthServing    HealthStatus = "SERVING"
	HealthNotServing HealthStatus = "NOT_SERVING"
)

func (h HealthStatus) valid() bool {
	return h == HealthUnknown || h == HealthServing || h == HealthNotServing
}

// health holds a server's statuses: "" (the whole server) and its service
// start as HealthServing at Start, unless SetServingStatus set them.
type health struct {
	status map[string]HealthStatus // guarded by Server.mu
	// set are the services SetServingStatus was called for: Start leaves
	// their status alone, so that a server told before Start that it is
	// not serving (warming up, say) is not registered because it started.
	// Guarded by Server.mu.
	set map[string]bool
	// stopping is set once a shutdown has begun, or Start failed:
	// nothing serves again.
	stopping bool
	// advertised is whether the instance is in the registry now; only
	// Start, SetServingStatus and Shutdown change it, under Server.regLock.
	advertised bool
	// registrations counts the instance's registrations, each of which
	// writes it with no load: the load reporter then writes its load anew.
	// Written under Server.regLock.
	registrations atomic.Uint64
}

func (s *Server) registerHealth() {
	s.health.status = map[string]HealthStatus{"": HealthNotServing}
	s.health.set = map[string]bool{}
	if s.cfg.Service != "" {
		s.health.status[s.cfg.Service] = HealthNotServing
	}
	Handle(s, HealthCheckMethod, s.checkHealth)
}

func (s *Server) checkHealth(_ context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	s.mu.Lock()
	st, ok := s.health.status[req.GetValue()]
	s.mu.Unlock()
	if !ok {
		return nil, kernel.Errorf(kernel.NotFound, "health: service %q is not served here (this server reports on %q)", req.GetValue(), s.healthServices())
	}
	return wrapperspb.String(string(st)), nil
}

func (s *Server) healthServices() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.health.status))
}

// ServingStatus is what the health service answers for service ("" is the
// whole server), and whether the server reports on it at all.
func (s *Server) ServingStatus(service string) (HealthStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.health.status[service]
	return st, ok
}

// probeStatus is the server's health as its probes (/healthz, the
// console, the engine's server_serving reading) report it: the whole
// server's status, unless that is SERVING while the server's own service
// is not, which takes the instance out of the registry too.
func (s *Server) probeStatus() HealthStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.health.status[""]
	if st == HealthServing && s.cfg.Service != "" {
		if own, ok := s.health.status[s.cfg.Service]; ok {
			st = own
		}
	}
	return st
}

// SetServingStatus sets what the health service answers for service (""
// is the whole server; another name adds a service to report on). When
// the server's own service or the whole server stops serving, the
// instance is deregistered, so that clients stop picking it; when both
// serve again it is registered again. A status set before Start is kept:
// Start turns SERVING only the ones nobody set. Once a shutdown has
// begun, or Start failed, every status is NOT_SERVING and SERVING is
// refused. The error is the registry's, or says why SERVING was refused.
func (s *Server) SetServingStatus(ctx context.Context, service string, st HealthStatus) error {
	if !st.valid() {
		return fmt.Errorf("kernrpc: SetServingStatus %q: unknown status %q (want %s, %s or %s)", service, st, HealthServing, HealthNotServing, HealthUnknown)
	}
	s.mu.Lock()
	if s.health.stopping && st == HealthServing {
		unlisted := s.unlisted
		s.mu.Unlock()
		if unlisted {
			return fmt.Errorf("kernrpc: SetServingStatus %q: the server failed to start; make a new one", service)
		}
		return fmt.Errorf("kernrpc: SetServingStatus %q: the server is shutting down", service)
	}
	s.health.status[service] = st
	s.health.set[service] = true
	s.mu.Unlock()
	return s.syncRegistration(ctx)
}

// servingLocked is whether the instance should be in the registry.
func (s *Server) servingLocked() bool {
	return s.health.status[""] == HealthServing && (s.cfg.Service == "" || s.health.status[s.cfg.Service] == HealthServing)
}

// syncRegistration puts the instance in the registry or takes it out, as
// its health says once the registry lock is held: of status changes
// racing each other, the one that writes the registry last reads the
// status written last, so the registry ends up agreeing with it.
func (s *Server) syncRegistration(ctx context.Context) error {
	if s.cfg.Service == "" {
		return nil
	}
	if err := s.lockRegistry(ctx); err != nil {
		return s.registryError(err)
	}
	defer s.unlockRegistry()
	s.mu.Lock()
	on := s.started && s.listener != nil && s.servingLocked()
	s.mu.Unlock()
	return s.advertiseLocked(ctx, on)
}

// advertiseLocked is advertise with the registry lock held.
func (s *Server) advertiseLocked(ctx context.Context, on bool) error {
	if s.health.advertised == on {
		return nil
	}
	inst := s.Instance()
	if !on {
		if err := s.registry.Deregister(ctx, inst); err != nil {
			return s.registryError(fmt.Errorf("deregister %s: %w", inst.ID, err))
		}
		s.health.advertised = false
		return nil
	}
	if err := s.registry.Register(ctx, inst, s.cfg.Server.RegisterTTL.D()); err != nil {
		return s.registryError(fmt.Errorf("register %s at %s: %w", inst.Service, inst.Address, err))
	}
	s.health.advertised = true
	s.health.registrations.Add(1)
	if s.shutdownBegun() {
		// Shutdown began while the registry took this registration (one
		// that outlasted Shutdown's wait for it): it must not outlive the
		// server.
		dctx, cancel := context.WithTimeout(context.Background(), deregisterTimeout)
		defer cancel()
		if err := s.advertiseLocked(dctx, false); err != nil {
			return err
		}
		return s.registryError(fmt.Errorf("register %s at %s: the server began shutting down meanwhile; taken out again", inst.Service, inst.Address))
	}
	return nil
}

// lockRegistry takes the right to write the instance to the registry,
// giving up when ctx ends: a registry write that hangs (a plugin that
// ignores its context) must not hold Shutdown, or a caller of
// SetServingStatus, past its deadline.
func (s *Server) lockRegistry(ctx context.Context) error {
	select {
	case s.regLock <- struct{}{}:
		return nil
	default:
	}
	select {
	case s.regLock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for another registry write to finish: %w", context.Cause(ctx))
	}
}

func (s *Server) unlockRegistry() { <-s.regLock }

// registryError wraps err as the registry plugin's error.
func (s *Server) registryError(err error) error {
	return &kernel.PluginError{Source: s.cfg.Source, Kind: kernel.KindRegistry, Name: s.cfg.Registry.Name, Err: err}
}

// setAllNotServing is the first step of a shutdown.
func (s *Server) setAllNotServing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health.stopping = true
	for svc := range s.health.status {
		s.health.status[svc] = HealthNotServing
	}
}

// CheckHealth asks the instance the balancer picks for service's health
// ("" asks about the whole server). An instance that does not report on
// service answers with a NotFound status.
func (c *Client) CheckHealth(ctx context.Context, service string) (HealthStatus, error) {
	var resp wrapperspb.StringValue
	if err := c.Call(ctx, HealthCheckMethod, wrapperspb.String(service), &resp); err != nil {
		return HealthUnknown, err
	}
	st := HealthStatus(resp.GetValue())
	if !st.valid() {
		return HealthUnknown, fmt.Errorf("kernrpc: health: the server answered with an unknown status %q", resp.GetValue())
	}
	return st, nil
}
