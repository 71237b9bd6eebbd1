package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"go.uber.org/goleak"
)

// serve and call run servers and clients in this process: none of their
// goroutines may outlive the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kernrpc.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPluginsListsTheBuiltins(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"plugins", "-v"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"transport  tcp-lv", "codec      protobuf", "codec      json", "codec      msgpack", "codec      flatbuffers",
		"registry   memory", "registry   etcd", "registry   consul", "filter     prometheus", "filter     otel-tracing",
		"balancer   round-robin", `"max_frame_size"`, `"discard_unknown":false`, `"max_pooled_builder":"1MiB"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plugins output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestServeWithAnUnknownTransportExitsNonZeroNamingIt(t *testing.T) {
	cfg := writeConfig(t, "service: echo\ntransport: {name: nope}\n")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"serve", "-config", cfg}, &out, &errOut)
	if code == 0 {
		t.Fatal("exit 0 for an unknown transport")
	}
	for _, want := range []string{`"nope"`, "tcp-lv", "forgotten import"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q: %s", want, errOut.String())
		}
	}
}

func TestBadInvocations(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", nil, 2, "Usage:"},
		{"unknown command", []string{"srve"}, 2, `unknown command "srve"`},
		{"serve without config", []string{"serve"}, 1, "pass -config FILE"},
		{"missing config file", []string{"serve", "-config", "/nonexistent/kernrpc.yaml"}, 1, "/nonexistent/kernrpc.yaml"},
		{"unknown flag", []string{"plugins", "-x"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"plugins", "extra"}, 2, "unexpected arguments"},
		{"call with only an in-process registry", []string{"call", "-config", "../../examples/echo/kernrpc.yaml"}, 1, "pass -addr HOST:PORT"},
		{"serve with a misspelt client balancer", []string{"serve", "-config", "testdata/bad-balancer.yaml"}, 1, `balancer "roundrobin": no balancer of that name`},
		{"health with the service twice", []string{"health", "127.0.0.1:1", "echo", "-service", "echo"}, 2, "the service is given twice: as an argument and with -service; pass one"},
		{"health with only an in-process registry", []string{"health", "-config", "../../examples/echo/kernrpc.yaml"}, 1, `names registry "memory", which lives inside one process; pass -addr HOST:PORT`},
		{"bench with a negative count", []string{"bench", "127.0.0.1:1", "Echo.Echo", "{}", "-n", "-1"}, 2, "-n -1: want a positive number of calls"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errOut)
			if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, cmd := range []string{"serve", "list", "describe", "call", "bench", "health", "plugins"} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{cmd, "-h"}, &out, &errOut); code != 0 {
			t.Errorf("%s -h: exit %d", cmd, code)
		}
		if !strings.Contains(errOut.String(), "Usage: kernrpc "+cmd) {
			t.Errorf("%s -h printed %q", cmd, errOut.String())
		}
	}
}

// kernrpc serve and call work with every built-in codec by changing the
// codec line of the config, and a server answers a client whose config
// names another codec than its own.
func TestServeThenCall(t *testing.T) {
	for _, codec := range []string{"protobuf", "json", "msgpack", "flatbuffers"} {
		t.Run(codec, func(t *testing.T) {
			const base = "service: echo\naddress: 127.0.0.1:0\nregistry: {name: memory, options: {namespace: cmd-test}}\n"
			cfg := writeConfig(t, base+"codec: {name: "+codec+"}\n")
			ctx, cancel := context.WithCancel(context.Background())
			var out, errOut syncbuf.Buffer
			done := make(chan int, 1)
			go func() { done <- run(ctx, []string{"serve", "-config", cfg}, &out, &errOut) }()
			addrRE := regexp.MustCompile(`serving echo on (\S+) `)
			var addr string
			for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if m := addrRE.FindStringSubmatch(out.String()); m != nil {
					addr = m[1]
				}
			}
			if addr == "" {
				cancel()
				t.Fatalf("serve did not start: %s %s", out.String(), errOut.String())
			}
			if want := "codec " + codec + ","; !strings.Contains(out.String(), want) {
				t.Errorf("serve printed %q, want it to name %q", out.String(), want)
			}
			// The same codec as the server, then the default one (protobuf).
			for _, clientCfg := range []string{cfg, writeConfig(t, base)} {
				var callOut, callErr bytes.Buffer
				if code := run(context.Background(), []string{"call", "-config", clientCfg, "-addr", addr, "-text", "ping " + codec}, &callOut, &callErr); code != 0 {
					t.Errorf("call: exit %d: %s", code, callErr.String())
				}
				if want := `Echo.Echo answered "ping ` + codec + `"`; !strings.Contains(callOut.String(), want) {
					t.Errorf("call printed %q, want %q", callOut.String(), want)
				}
			}
			cancel()
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("serve exited %d after a graceful stop: %s", code, errOut.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatal("serve did not stop")
			}
		})
	}
}

// kernrpc health asks a running server, prints a table, and exits 1 when
// the answer is not SERVING or the server cannot be reached.
func TestHealthCommand(t *testing.T) {
	cfg := writeConfig(t, "service: echo\naddress: 127.0.0.1:0\ncodec: flatbuffers\nregistry: {name: memory, options: {namespace: cmd-health}}\n")
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve", "-config", cfg}, &out, &errOut) }()
	defer func() { cancel(); <-done }()
	addrRE := regexp.MustCompile(`serving echo on (\S+) `)
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("serve did not start: %s %s", out.String(), errOut.String())
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-addr", addr}, 0, "SERVING"},
		{[]string{"-addr", addr, "-service", "-"}, 0, "SERVING"},
		{[]string{"-addr", addr, "-service", "nosuch"}, 1, "NotFound"},
		{[]string{"-addr", "127.0.0.1:1", "-timeout", "500ms"}, 1, "ERROR"},
		{nil, 1, "pass -addr"},
	} {
		var hOut, hErr bytes.Buffer
		code := run(context.Background(), append([]string{"health", "-config", cfg}, tc.args...), &hOut, &hErr)
		if code != tc.code || !strings.Contains(hOut.String()+hErr.String(), tc.want) {
			t.Errorf("health %v: exit %d, printed %q %q; want exit %d and %q", tc.args, code, hOut.String(), hErr.String(), tc.code, tc.want)
		}
	}
}

// serve says where its status console is when the config sets
// server.admin_address, and the page is there.
func TestServePrintsTheConsole(t *testing.T) {
	_, out := startServeOutput(t, serveConfig+"server: {admin_address: 127.0.0.1:0}\n")
	consoleRE := regexp.MustCompile(`status console on (http://\S+/status) `)
	m := consoleRE.FindStringSubmatch(out.String())
	// Printed just after the line startServeOutput waited for.
	for deadline := time.Now().Add(10 * time.Second); m == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		m = consoleRE.FindStringSubmatch(out.String())
	}
	if m == nil {
		t.Fatalf("serve with an admin address did not say where its console is:\n%s", out.String())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("GET %s: %s, %s; want the console page", m[1], resp.Status, resp.Header.Get("Content-Type"))
	}
	_, plain := startServeOutput(t, serveConfig)
	if strings.Contains(plain.String(), "status console") {
		t.Errorf("serve without an admin address printed a console line:\n%s", plain.String())
	}
}

// call's echo form: -codec picks the codec, and a config whose only
// instance is down says how to call a server directly.
func TestCallEchoCodecAndHint(t *testing.T) {
	addr := startServe(t, serveConfig)
	cfg := writeConfig(t, serveConfig)
	runCmd("", "call", "-config", cfg, "-addr", addr, "-codec", "json", "-text", "in json").check(t, "call -codec json", 0, `Echo.Echo answered "in json"`)
	runCmd("", "call", "-config", cfg, "-addr", addr, "-codec", "nosuch").check(t, "call -codec nosuch", 1, `codec "nosuch"`)
	down := writeConfig(t, "service: echo\nregistry: {name: memory, options: {static: {echo: [\"127.0.0.1:1\"]}}}\n")
	runCmd("", "call", "-config", down, "-timeout", "1s").check(t, "call an instance that is down", 1, "Unavailable", "to call one server directly, pass -addr HOST:PORT")
}
