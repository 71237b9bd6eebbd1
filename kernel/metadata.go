package kernel

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
