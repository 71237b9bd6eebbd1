package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/enginetest"
	"github.com/kernrpc/kernrpc/kernel"
)

func init() {
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-empty", New: func(any) (kernel.Registry, error) {
		return enginetest.FixedRegistry{}, nil
	}})
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-unreachable", New: func(any) (kernel.Registry, error) {
		return enginetest.FixedRegistry{Err: errors.New("connection refused")}, nil
	}})
	kernel.RegisterRegistry(kernel.Factory[kernel.Registry]{Name: "test-silent", New: func(any) (kernel.Registry, error) {
		return silentRegistry{}, nil
	}})
}

// silentRegistry answers Resolve only when ctx ends, or after 20s: a
// registry that is reached but does not answer.
type silentRegistry struct{ enginetest.FixedRegistry }

func (silentRegistry) Resolve(ctx context.Context, _ string) ([]kernel.Instance, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(20 * time.Second):
		return nil, errors.New("no answer in 20s")
	}
}

// Without -addr, health asks every instance the config's registry lists,
// one row each, and exits 1 unless all of them serve; a registry that
// lists none, or cannot be reached, is an error saying so.
func TestHealthThroughTheRegistry(t *testing.T) {
	addr := startServe(t, serveConfig)
	static := func(addrs string) string {
		return writeConfig(t, fmt.Sprintf("service: echo\nregistry: {name: memory, options: {static: {echo: [%s]}}}\n", addrs))
	}
	for _, tc := range []struct {
		name, config string
		code         int
		wants        []string
	}{
		{"one instance, serving", static(addr), 0, []string{addr, "SERVING"}},
		{"one of two unreachable", static(addr + ", 127.0.0.1:1"), 1, []string{"SERVING", "127.0.0.1:1", "ERROR", `not every instance of "echo" is serving`}},
		{"a registry listing none", writeConfig(t, "service: echo\nregistry: test-empty\n"), 1, []string{`registry "test-empty" lists no instance of "echo"`, "pass -addr"}},
		{"a registry unreachable", writeConfig(t, "service: echo\nregistry: test-unreachable\n"), 1, []string{`resolve "echo" through registry "test-unreachable": connection refused`}},
		// A probe's -timeout bounds the lookup too, not only each instance.
		{"a registry that does not answer", writeConfig(t, "service: echo\nregistry: test-silent\n"), 1, []string{`resolve "echo" through registry "test-silent": no answer within -timeout 500ms`}},
	} {
		runCmd("", "health", "-config", tc.config, "-timeout", "500ms").check(t, "health: "+tc.name, tc.code, tc.wants...)
	}
}

// A server whose auth filter guards every method guards its health
// service too; health with the config both sides share carries the
// client's token, as call, list and bench do, and finds it serving.
func TestHealthCarriesTheConfigsClientFilters(t *testing.T) {
	const authAll = `service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: cmd-health-auth}}
filters:
  - {name: auth, side: client, options: {token: s3cret}}
  - {name: auth, side: server, options: {tokens: [s3cret]}}
`
	addr := startServe(t, authAll)
	cfg := writeConfig(t, authAll)
	runCmd("", "call", "-config", cfg, "-addr", addr, "-text", "hi").check(t, "call with the shared config", 0, `Echo.Echo answered "hi"`)
	runCmd("", "health", "-config", cfg, "-addr", addr).check(t, "health -config -addr with the shared config", 0, "SERVING")
	runCmd("", "health", "-config", cfg, addr).check(t, "health -config ADDR with the shared config", 0, "SERVING")
	runCmd("", "health", addr, "-timeout", "1s").check(t, "health ADDR without the token", 1, "Unauthenticated")
}
