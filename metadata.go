package kernrpc

import (
	"context"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

type outgoingMDKey struct{}

// WithMetadata returns a context whose calls send md to the server, merged
// over any metadata already attached to ctx. md is kept as it is, not
// copied (a map per context would cost every call that attaches one): it
// must not change while calls may use the context, as they read it
// concurrently. Filters never write into it.
func WithMetadata(ctx context.Context, md kernel.Metadata) context.Context {
	if prev, ok := ctx.Value(outgoingMDKey{}).(kernel.Metadata); ok && len(prev) > 0 {
		merged := prev.Clone()
		for k, v := range md {
			merged[k] = v
		}
		md = merged
	}
	return context.WithValue(ctx, outgoingMDKey{}, md)
}

// OutgoingMetadata returns the metadata attached to ctx by WithMetadata:
// the map the calls read, to read too, not to change (Clone it for that).
func OutgoingMetadata(ctx context.Context) kernel.Metadata {
	md, _ := ctx.Value(outgoingMDKey{}).(kernel.Metadata)
	return md
}

// CallOption changes one call or stream: metadata to send with it, a
// timeout, where to put the metadata the server sends back. Generated
// clients take them; a call without any costs nothing extra.
type CallOption func(*callOptions)

type callOptions struct {
	md       kernel.Metadata
	timeout  time.Duration
	response *kernel.Metadata
	ready    *bool // WaitForReady, when given
}

// CallMetadata sends md with the call, merged over what the context
// carries (WithMetadata).
func CallMetadata(md kernel.Metadata) CallOption {
	return func(o *callOptions) {
		if o.md == nil {
			o.md = make(kernel.Metadata, len(md))
		}
		for k, v := range md {
			o.md[k] = v
		}
	}
}

// CallTimeout bounds the call (or the whole stream) by d, as a context
// with that timeout would.
func CallTimeout(d time.Duration) CallOption {
	return func(o *callOptions) { o.timeout = d }
}

// ReceiveMetadata stores the metadata the server answers a call with in
// *dst once the call returns. Streams ignore it: their Header and Trailer
// methods give theirs.
func ReceiveMetadata(dst *kernel.Metadata) CallOption {
	return func(o *callOptions) { o.response = dst }
}

// WaitForReady sets client.wait_for_ready for this call or stream: true
// waits, up to the deadline, for an instance that can take it (one that
// accepts the dial, not shutting down); false fails at once.
func WaitForReady(wait bool) CallOption {
	return func(o *callOptions) { o.ready = &wait }
}

// applyCallOptions derives the call's context from opts; done releases
// what it made.
func applyCallOptions(ctx context.Context, opts []CallOption) (_ context.Context, o callOptions, done func()) {
	done = func() {}
	if len(opts) == 0 {
		return ctx, o, done
	}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.md) > 0 {
		ctx = WithMetadata(ctx, o.md)
	}
	if o.ready != nil {
		ctx = context.WithValue(ctx, waitForReadyKey{}, *o.ready)
	}
	if o.timeout > 0 {
		ctx, done = context.WithTimeout(ctx, o.timeout)
	}
	return ctx, o, done
}
