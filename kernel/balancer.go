package kernel

import (
	"context"
	"errors"
)

// Balancer picks the instance one call goes to. The client gives it the
// current set whenever the registry reports a change. Pick and Update may be
// called concurrently.
type Balancer interface {
	// Update replaces the set of instances picks are made from. The balancer
	// may keep the slice; the caller does not modify it afterwards.
	Update(instances []Instance)
	// Pick returns one of the current instances for the call info describes
	// (a consistent-hash balancer reads its key from info.Metadata). With no
	// instances it returns an error wrapping ErrNoInstances. The instance
	// returned must stay unchanged while the caller holds it, later Updates
	// notwithstanding (the call in flight dials its Address, and
	// PickObserver.Done is given it): point into a set Update was given, or
	// into memory the balancer never writes again.
	Pick(ctx context.Context, info *CallInfo) (*Instance, error)
}

// PickObserver is an optional Balancer interface: a balancer that wants to
// know how its picks went (least-load counts in-flight calls) is told when
// each picked call ends.
type PickObserver interface {
	Done(inst *Instance, err error)
}

// ErrNoInstances is wrapped by Pick when there is nothing to pick from.
var ErrNoInstances = errors.New("no instances available")
