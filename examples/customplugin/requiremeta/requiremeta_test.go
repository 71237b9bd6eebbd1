package requiremeta_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc/examples/customplugin/requiremeta"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugintest"
)

// The conformance suite certifies the filter as it would any other: the
// suite's calls carry the required key, so they pass and the suite can
// check what the filter hands on.
func TestPluginTest(t *testing.T) {
	plugintest.Filter(t, requiremeta.Factory, plugintest.FilterConfig{
		Options:       map[string]any{"keys": []any{"tenant"}, "code": "PermissionDenied"},
		Metadata:      kernel.Metadata{"tenant": "acme"},
		BadOptions:    map[string]any{"code": "Teapot"},
		BadOptionsKey: "code",
	})
}

func TestRegisteredUnderName(t *testing.T) {
	if _, err := kernel.NewFilter(requiremeta.Name, map[string]any{"keys": []any{"tenant"}}, "test.yaml"); err != nil {
		t.Fatalf("NewFilter(%q): %v", requiremeta.Name, err)
	}
}

func TestRejectsCallsWithoutTheKeys(t *testing.T) {
	f, err := requiremeta.Factory.Build(map[string]any{"keys": []any{"tenant", "request-id"}, "code": "Unauthenticated"}, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		md       kernel.Metadata
		wantCode kernel.Code
		missing  string // the key the rejection must name
	}{
		{"both keys", kernel.Metadata{"tenant": "acme", "request-id": "7"}, kernel.OK, ""},
		{"no metadata at all", nil, kernel.Unauthenticated, "tenant"},
		{"second key missing", kernel.Metadata{"tenant": "acme"}, kernel.Unauthenticated, "request-id"},
		{"empty value", kernel.Metadata{"tenant": "", "request-id": "7"}, kernel.Unauthenticated, "tenant"},
		{"keys are case-sensitive", kernel.Metadata{"Tenant": "acme", "request-id": "7"}, kernel.Unauthenticated, "tenant"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			next := func(context.Context, *kernel.CallInfo, any) (any, error) { called = true; return "answer", nil }
			info := &kernel.CallInfo{Method: "Echo.Echo", Side: kernel.ServerSide, Metadata: tc.md}
			resp, err := f.Invoke(t.Context(), info, "request", next)
			if got := kernel.CodeOf(err); got != tc.wantCode {
				t.Fatalf("code = %s (%v), want %s", got, err, tc.wantCode)
			}
			if tc.wantCode == kernel.OK {
				if !called || resp != "answer" {
					t.Errorf("a call with every key: next called %v, resp %v; want it passed through", called, resp)
				}
				return
			}
			if called {
				t.Error("a rejected call reached next")
			}
			if !strings.Contains(err.Error(), `"`+tc.missing+`"`) || !strings.Contains(err.Error(), "Echo.Echo") {
				t.Errorf("rejection %q does not name the missing key %q and the method", err, tc.missing)
			}
		})
	}
}

func TestOptionsAreValidated(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		want    string // in the error
	}{
		{"unknown code", map[string]any{"code": "Teapot"}, `option "code": "Teapot" is not a status code; use one of OK, Canceled,`},
		{"OK is no rejection", map[string]any{"code": "OK"}, `option "code": OK would report a rejected call as a success`},
		{"empty key", map[string]any{"keys": []any{"tenant", " "}}, `option "keys": entry 1 is empty`},
		{"unknown option", map[string]any{"key": []any{"tenant"}}, `option "key": unknown key (known keys: code, keys)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := requiremeta.Factory.Build(tc.options, "svc.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build(%v) = %v, want an error containing %q", tc.options, err, tc.want)
			}
		})
	}
	if _, err := requiremeta.Factory.Build(nil, "svc.yaml"); err != nil {
		t.Errorf("the defaults do not build: %v", err)
	}
}
