package plugintest

import (
	"context"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// valuerKey is the key of the test valuers' own value.
type valuerKey struct{}

// valuerFilter is a server filter that hands the handler the call's
// "trace" metadata entry under valuerKey (kernel.ContextValuer); the
// broken designs mishandle keys that are not theirs.
type valuerFilter struct {
	answersAll bool // answers every key with the entry
	asserts    bool // asserts that every key is a valuerKey
}

func (valuerFilter) Side() kernel.Side { return kernel.ServerSide }

func (valuerFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f valuerFilter) CallValue(info *kernel.CallInfo, key any) (any, bool) {
	switch {
	case f.answersAll:
		return info.Metadata["trace"], true
	case f.asserts:
		_ = key.(valuerKey)
		return info.Metadata["trace"], true
	}
	if _, ok := key.(valuerKey); ok {
		return info.Metadata["trace"], true
	}
	return nil, false
}

func valuerFactory(f valuerFilter) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{Name: "valuer", New: func(any) (kernel.Filter, error) { return f, nil }}
}

// TestFilterChecksContextValuers: a ContextValuer that answers keys it
// does not own (hiding the base context's values from every handler), or
// panics on them, is caught by Filter/ContextValuer and passes every
// other check; a correct one passes, and filters that are no
// ContextValuer skip it, saying so.
func TestFilterChecksContextValuers(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    valuerFilter
		says string
	}{
		{"answers every key", valuerFilter{answersAll: true}, "a key of the suite's own"},
		{"panics on a key of another", valuerFilter{asserts: true}, "panicked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, valuerFactory(tc.f), FilterConfig{})
			expectCaught(t, rec, "Filter/ContextValuer/Server")
			expectMessage(t, rec, "Filter/ContextValuer", tc.says)
			onlyUnder(t, rec, "Filter/ContextValuer")
		})
	}
	t.Run("correct", func(t *testing.T) {
		rec := filterRecord(t, valuerFactory(valuerFilter{}), FilterConfig{})
		for _, f := range rec.failures {
			t.Errorf("a correct ContextValuer failed %s: %s", f.path, f.msg)
		}
		if why := rec.skippedUnder("Filter/ContextValuer/Server"); why != "" {
			t.Errorf("Filter/ContextValuer/Server skipped for a ContextValuer: %s", why)
		}
	})
	t.Run("not a valuer", func(t *testing.T) {
		rec := filterRecord(t, sidedFactory(kernel.ServerSide), FilterConfig{})
		if why := rec.skippedUnder("Filter/ContextValuer"); why == "" {
			t.Errorf("Filter/ContextValuer was not skipped for a filter that is no kernel.ContextValuer")
		}
	})
}
