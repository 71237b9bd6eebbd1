package kernel

import "context"

// Metadata is the key/value data that travels beside a call: from client to
// server with the request, and from server to client with the response.
// Keys are case-sensitive; by convention they are lower-case.
type Metadata map[string]string

// Clone returns a copy of md; nil stays nil.
func (md Metadata) Clone() Metadata {
	if md == nil {
		return nil
	}
	out := make(Metadata, len(md))
	for k, v := range md {
		out[k] = v
	}
	return out
}

type outgoingMDKey struct{}

// WithMetadata returns a context whose calls send md to the server, merged
// over any metadata already attached to ctx.
func WithMetadata(ctx context.Context, md Metadata) context.Context {
	if prev, ok := ctx.Value(outgoingMDKey{}).(Metadata); ok && len(prev) > 0 {
		merged := prev.Clone()
		for k, v := range md {
			merged[k] = v
		}
		md = merged
	}
	return context.WithValue(ctx, outgoingMDKey{}, md)
}

// OutgoingMetadata returns the metadata attached to ctx by WithMetadata.
func OutgoingMetadata(ctx context.Context) Metadata {
	md, _ := ctx.Value(outgoingMDKey{}).(Metadata)
	return md
}
