// Package headerstamp is a client filter that stamps one metadata entry on
// every call, so that the server can tell who sent it. It is the running
// example of docs/plugins.md: a plugin written as one outside the kernrpc
// repository would be, with only the kernel package.
//
// Config name: "header-stamp". Options, with defaults:
//
//	filters:
//	  - name: header-stamp
//	    side: client
//	    options:
//	      key: x-stamp          # the request metadata key to set
//	      value: <program name> # what to set it to; must not be empty
package headerstamp

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "header-stamp"

// Options configure the filter.
type Options struct {
	// Key is the request metadata key the filter sets.
	Key string `json:"key"`
	// Value is what it sets Key to; it must not be empty.
	Value string `json:"value"`
}

// DefaultOptions returns the options a config without an options block
// gets: the program's name under x-stamp.
func DefaultOptions() *Options {
	return &Options{Key: "x-stamp", Value: filepath.Base(os.Args[0])}
}

// New builds the filter from decoded options, refusing an empty key or
// value.
func New(o *Options) (kernel.Filter, error) {
	if o.Key == "" {
		return nil, errors.New(`option "key": must not be empty`)
	}
	if o.Value == "" {
		return nil, errors.New(`option "value": must not be empty`)
	}
	return &Filter{key: o.Key, value: o.Value}, nil
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "stamps a metadata entry on every call", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// Filter sets one request metadata entry and passes the call on.
type Filter struct {
	key, value string
}

var _ kernel.Filter = (*Filter)(nil)

// Invoke stamps the entry and calls next once.
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	info.SetRequestMetadata(f.key, f.value)
	return next(ctx, info, req)
}
