package kernrpc

import (
	"context"

	"github.com/kernrpc/kernrpc/kernel"
)

type outgoingMDKey struct{}

// WithMetadata returns a context whose calls send md to the server, merged
// over any metadata already attached to ctx.
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

// OutgoingMetadata returns the metadata attached to ctx by WithMetadata.
func OutgoingMetadata(ctx context.Context) kernel.Metadata {
	md, _ := ctx.Value(outgoingMDKey{}).(kernel.Metadata)
	return md
}
