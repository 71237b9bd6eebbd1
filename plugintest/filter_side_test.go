package plugintest

import (
	"context"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/kernel"
)

// sidedFilter passes every call on, and declares side.
type sidedFilter struct{ side kernel.Side }

func (sidedFilter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	return next(ctx, info, req)
}

func (f sidedFilter) Side() kernel.Side { return f.side }

func sidedFactory(side kernel.Side) kernel.Factory[kernel.Filter] {
	return kernel.Factory[kernel.Filter]{
		Name: "sided",
		New:  func(any) (kernel.Filter, error) { return sidedFilter{side}, nil },
	}
}

// A filter that declares one side is checked there only, with or without
// FilterConfig.Side naming it.
func TestFilterChecksASidedFilterOnItsSideOnly(t *testing.T) {
	for _, cfg := range []FilterConfig{{}, {Side: kernel.ClientSide}} {
		rec := filterRecord(t, sidedFactory(kernel.ClientSide), cfg)
		if len(rec.failures) > 0 {
			t.Fatalf("FilterConfig.Side %s: failures %v", cfg.Side, rec.failures)
		}
		client := 0
		for _, p := range rec.paths() {
			if strings.HasSuffix(p, "/Server") {
				t.Errorf("FilterConfig.Side %s: the suite ran %s on the side the filter does not work on", cfg.Side, p)
			}
			if strings.HasSuffix(p, "/Client") {
				client++
			}
		}
		if client == 0 {
			t.Errorf("FilterConfig.Side %s: the suite ran no check on the client side", cfg.Side)
		}
	}
}

func TestFilterCatchesAWrongSide(t *testing.T) {
	cases := []struct {
		name string
		f    kernel.Factory[kernel.Filter]
		cfg  FilterConfig
		says string
	}{
		{"configured on the other side", sidedFactory(kernel.ClientSide), FilterConfig{Side: kernel.ServerSide},
			"works on the client side only"},
		{"declares a side that is neither", sidedFactory(kernel.Side(7)), FilterConfig{},
			"neither client nor server"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := filterRecord(t, tc.f, tc.cfg)
			expectCaught(t, rec, "Filter/Side")
			expectMessage(t, rec, "Filter/Side", tc.says)
			if got := rec.failures; len(got) != 1 {
				t.Errorf("failures %v; want the one under Filter/Side, and no check run after it", got)
			}
		})
	}
}
