// Package requiremeta is a kernrpc filter that rejects calls lacking the
// metadata a service relies on (a tenant, an API key, a request id) before
// they cost anything: on the server before the handler runs, on the client
// before the request is sent.
//
// It is written the way a plugin outside the kernrpc repository would be:
// it uses only the kernel package's public API. See ../README.md.
//
// Config name: "require-metadata". Options, with defaults:
//
//	filters:
//	  - name: require-metadata
//	    side: server
//	    options:
//	      keys: []              # metadata keys every call must carry, non-empty
//	      code: InvalidArgument # the status code of a rejected call
package requiremeta

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "require-metadata"

// Options configure the filter.
type Options struct {
	// Keys are the metadata keys every call must carry with a non-empty
	// value. Keys are case-sensitive; by convention lower-case. None: every
	// call passes.
	Keys []string `json:"keys"`
	// Code is the status code a rejected call ends with, by name:
	// "InvalidArgument", "Unauthenticated", "PermissionDenied", ...
	Code kernel.Code `json:"code"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{Code: kernel.InvalidArgument}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "rejects calls that lack required metadata keys", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from validated options.
func New(o *Options) (kernel.Filter, error) {
	if o.Code == kernel.OK {
		return nil, fmt.Errorf("option \"code\": OK would report a rejected call as a success; pick an error code such as %s", kernel.InvalidArgument)
	}
	for i, k := range o.Keys {
		if strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("option \"keys\": entry %d is empty; list the metadata keys every call must carry", i)
		}
	}
	return &filter{keys: slices.Clone(o.Keys), code: o.Code}, nil
}

type filter struct {
	keys []string
	code kernel.Code
}

var _ kernel.Filter = (*filter)(nil)

// Invoke passes the call on if it carries every required key, and rejects
// it otherwise without calling next.
func (f *filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	for _, k := range f.keys {
		if info.Metadata[k] == "" {
			return nil, kernel.Errorf(f.code, "%s: call to %s lacks metadata %q; the caller must send it (kernrpc.WithMetadata)", Name, info.Method, k)
		}
	}
	return next(ctx, info, req)
}
