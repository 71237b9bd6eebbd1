package main

import "testing"

// A leading dot, as describe prints message types (.pkg.Msg) and as
// describe accepts, names the same method or service in every command.
func TestLeadingDotNamesTheSameMethod(t *testing.T) {
	addr := startServe(t, serveConfig)
	r := runCmd("", "call", addr, "."+echoM, `{"text":"dot"}`, "-H", token)
	r.check(t, "call .SERVICE.METHOD", 0)
	if r.code == 0 {
		jsonIs(t, "call .SERVICE.METHOD", r.out, `{"text":"dot"}`)
	}
	runCmd("", "bench", addr, "."+echoM, `{"text":"dot"}`, "-H", token, "-n", "3", "-c", "1", "-d", "0").check(t, "bench .SERVICE.METHOD", 0, "3 OK")
	runCmd("", "describe", addr, ".Echo").check(t, "describe .Echo", 1, `service "Echo" is served by name only`)
	runCmd("", "describe", addr, ".Echo.Echo").check(t, "describe .Echo.Echo", 1, "served by name only")
}

// Each form of call refuses the flags only the other form reads, rather
// than ignoring them.
func TestCallRefusesTheOtherFormsFlags(t *testing.T) {
	cfg := writeConfig(t, "service: echo\nregistry: {name: memory, options: {static: {echo: [\"127.0.0.1:1\"]}}}\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"-d in the echo form", []string{"-config", cfg, "-addr", "127.0.0.1:1", "-d", `{"text":"x"}`}, "-d"},
		{"-registry in the echo form", []string{"-config", cfg, "-registry", "etcd"}, "-registry"},
		{"-protoset in the echo form", []string{"-config", cfg, "-addr", "127.0.0.1:1", "-protoset", notesSet}, "-protoset"},
		{"-text in the JSON form", []string{"127.0.0.1:1", echoM, "-text", "hi"}, "-text"},
		{"-method in the JSON form", []string{"127.0.0.1:1", echoM, "-method", "Echo.Echo"}, "-method"},
	} {
		runCmd("", append([]string{"call"}, tc.args...)...).check(t, "call "+tc.name, 2, tc.want, "Usage: kernrpc call")
	}
}

// -H is sent with each call call makes, the reflection lookups included: a
// server whose auth filter guards its reflection service too
// (docs/reflection.md) lets the token through, to call, list and describe.
func TestHeadersReachReflection(t *testing.T) {
	addr := startServe(t, `service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: cmd-inspect-guarded}}
filters:
  - {name: auth, side: server, methods: ["kernrpc.echo.EchoService.*", "kernrpc.reflection.v1.*"], options: {tokens: [s3cret]}}
`)
	r := runCmd("", "call", addr, echoM, `{"text":"guarded"}`, "-H", token)
	r.check(t, "call with reflection guarded", 0)
	if r.code == 0 {
		jsonIs(t, "call with reflection guarded", r.out, `{"text":"guarded"}`)
	}
	runCmd("", "list", addr, "-H", token).check(t, "list with reflection guarded", 0, "kernrpc.echo.EchoService.Echo")
	runCmd("", "describe", "-H", token, addr, "kernrpc.echo.Echo").check(t, "describe with reflection guarded", 0, "message Echo {")
	runCmd("", "list", addr).check(t, "list without the token", 1, "Unauthenticated")
}
