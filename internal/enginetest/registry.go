package enginetest

import (
	"context"
	"errors"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// FixedRegistry is a registry for tests that keeps nothing: Register and
// Deregister succeed, Resolve gives Instances (or fails with Err), Watch
// fails. Embed it to change one method.
type FixedRegistry struct {
	Instances []kernel.Instance
	Err       error
}

var _ kernel.Registry = FixedRegistry{}

func (FixedRegistry) Register(context.Context, kernel.Instance, time.Duration) error { return nil }

func (FixedRegistry) Deregister(context.Context, kernel.Instance) error { return nil }

func (r FixedRegistry) Resolve(context.Context, string) ([]kernel.Instance, error) {
	return r.Instances, r.Err
}

func (r FixedRegistry) Watch(context.Context, string) (<-chan []kernel.Instance, error) {
	if r.Err != nil {
		return nil, r.Err
	}
	return nil, errors.New("enginetest: a FixedRegistry cannot be watched")
}

func (FixedRegistry) Close() error { return nil }
