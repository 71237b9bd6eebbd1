package kernel

import (
	"context"
	"errors"
	"strings"
	"testing"
)

type nopFilter struct{}

func (nopFilter) Invoke(ctx context.Context, info *CallInfo, req any, next Invoker) (any, error) {
	return next(ctx, info, req)
}

type testFilterOptions struct {
	Rate    int      `json:"rate"`
	Burst   Size     `json:"burst"`
	Window  Duration `json:"window"`
	Methods []string `json:"methods"`
}

func newTestTable() *pluginTable[Filter] {
	t := &pluginTable[Filter]{kind: KindFilter}
	t.register(NewFactory[Filter]("alpha", "test filter", func() *testFilterOptions { return &testFilterOptions{Rate: 5} },
		func(o *testFilterOptions) (Filter, error) {
			if o.Rate <= 0 {
				return nil, errors.New(`option "rate": must be positive`)
			}
			return nopFilter{}, nil
		}))
	t.register(Factory[Filter]{Name: "beta", New: func(any) (Filter, error) { return nopFilter{}, nil }})
	return t
}

func TestUnknownPluginErrorNamesItListsKnownAndHintsAtImport(t *testing.T) {
	_, err := newTestTable().build("nope", nil, "svc.yaml")
	var upe *UnknownPluginError
	if !errors.As(err, &upe) {
		t.Fatalf("err = %v, want *UnknownPluginError", err)
	}
	for _, want := range []string{`"nope"`, "filter", "alpha, beta", "forgotten import", "plugins/all"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestRegisterPanics(t *testing.T) {
	cases := []struct {
		name string
		f    Factory[Filter]
	}{
		{"duplicate name", Factory[Filter]{Name: "alpha", New: func(any) (Filter, error) { return nil, nil }}},
		{"empty name", Factory[Filter]{New: func(any) (Filter, error) { return nil, nil }}},
		{"nil New", Factory[Filter]{Name: "gamma"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newTestTable()
			defer func() {
				if recover() == nil {
					t.Fatal("register did not panic")
				}
			}()
			tbl.register(tc.f)
		})
	}
}

func TestOptionsDecodeStrictly(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		wantErr []string // substrings; empty means success
	}{
		{"defaults", nil, nil},
		{"all kinds of values", map[string]any{"rate": 3, "burst": "4KiB", "window": "250ms", "methods": []any{"Echo.*"}}, nil},
		{"unknown key names plugin, key and file", map[string]any{"rtae": 3}, []string{`filter "alpha"`, `option "rtae"`, "unknown key", "known keys: burst, methods, rate, window", "svc.yaml"}},
		{"wrong type names key", map[string]any{"rate": "fast"}, []string{`option "rate"`, "wrong type", "integer"}},
		{"bad duration", map[string]any{"window": "soon"}, []string{`option "window"`, `bad duration "soon"`}},
		{"duration without unit", map[string]any{"window": 5}, []string{`option "window"`, "with a unit"}},
		{"bad size", map[string]any{"burst": "lots"}, []string{`option "burst"`, `bad size "lots"`}},
		{"list where a number goes", map[string]any{"rate": []any{1}}, []string{"got an array"}},
		{"validation error names plugin", map[string]any{"rate": -1}, []string{`filter "alpha"`, `option "rate": must be positive`, "svc.yaml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTestTable().build("alpha", tc.options, "svc.yaml")
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want one mentioning %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestPluginWithoutOptionsRejectsAnyOption(t *testing.T) {
	_, err := newTestTable().build("beta", map[string]any{"x": 1}, "svc.yaml")
	if err == nil || !strings.Contains(err.Error(), `option "x"`) || !strings.Contains(err.Error(), "takes no options") {
		t.Fatalf("err = %v, want an error naming option x", err)
	}
}

// An unregistered factory (a plugin under test) builds the way a config
// naming it would, and its errors name the kind, plugin and key.
func TestFactoryBuildWithoutRegistering(t *testing.T) {
	f := NewFactory[Filter]("delta", "test filter", func() *testFilterOptions { return &testFilterOptions{Rate: 1} },
		func(o *testFilterOptions) (Filter, error) { return nopFilter{}, nil })
	if _, err := f.Build(map[string]any{"rate": 2}, "t.yaml"); err != nil {
		t.Fatalf("Build with good options: %v", err)
	}
	_, err := f.Build(map[string]any{"raet": 2}, "t.yaml")
	for _, want := range []string{`filter "delta"`, `option "raet"`, "t.yaml"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Build with an unknown key: err = %v, want it to mention %q", err, want)
		}
	}
	if _, err := (Factory[Codec]{Name: "nil-new"}).Build(nil, ""); err == nil || !strings.Contains(err.Error(), `codec "nil-new": its factory has a nil New`) {
		t.Errorf("Build of a factory without New: err = %v, want one naming the codec", err)
	}
}
