package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/reflectpb/testpb"
	"github.com/kernrpc/kernrpc/internal/syncbuf"
	"github.com/kernrpc/kernrpc/kernel"
)

// serveConfig is a kernrpc serve config whose proto-named echo method
// needs a bearer token, so that a call without one gets a non-OK status
// from the server.
const serveConfig = `service: echo
address: 127.0.0.1:0
registry: {name: memory, options: {namespace: cmd-inspect}}
filters:
  - {name: auth, side: server, methods: ["kernrpc.echo.EchoService.*"], options: {tokens: [s3cret]}}
`

const token = "authorization=Bearer s3cret"

// startServe runs kernrpc serve in this process until the test ends and
// returns the address it printed.
func startServe(t *testing.T, config string) string {
	t.Helper()
	addr, _ := startServeOutput(t, config)
	return addr
}

// startServeOutput is startServe that also returns what serve prints.
func startServeOutput(t *testing.T, config string) (string, *syncbuf.Buffer) {
	t.Helper()
	cfg := writeConfig(t, config)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve", "-config", cfg}, &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, errOut.String())
		}
	})
	addrRE := regexp.MustCompile(`serving \S+ on (\S+) `)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			return m[1], &out
		}
	}
	t.Fatalf("serve did not start: %s %s", out.String(), errOut.String())
	return "", nil
}

type result struct {
	code        int
	out, stderr string
}

func runCmd(stdin string, args ...string) result {
	var out, errOut bytes.Buffer
	code := runIO(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// check fails unless r exited with code and its stdout and stderr hold
// every one of wants.
func (r result) check(t *testing.T, what string, code int, wants ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.out, r.stderr)
		return
	}
	for _, w := range wants {
		if !strings.Contains(r.out+r.stderr, w) {
			t.Errorf("%s: output lacks %q\nstdout: %s\nstderr: %s", what, w, r.out, r.stderr)
		}
	}
}

// jsonIs fails unless text is JSON equal to want.
func jsonIs(t *testing.T, what, text, want string) {
	t.Helper()
	var got, w any
	if err := json.Unmarshal([]byte(text), &got); err != nil {
		t.Errorf("%s printed %q, not JSON: %v", what, text, err)
		return
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) {
		t.Errorf("%s printed %s, want %s", what, text, want)
	}
}

const echoM = "kernrpc.echo.EchoService.Echo"

func TestListAgainstServe(t *testing.T) {
	addr := startServe(t, serveConfig)
	r := runCmd("", "list", addr)
	r.check(t, "list", 0,
		"kernrpc.echo.EchoService", "internal/echopb/echo.proto",
		"kernrpc.reflection.v1.Reflection.ListServices", "Echo.Echo", "(by name only: no descriptor)", "kernrpc.Health.Check")
	for _, re := range []string{
		`\n  kernrpc\.echo\.EchoService\.Echo +unary +kernrpc\.echo\.Echo → kernrpc\.echo\.Echo\n`,
		`\n  Echo\.Echo +unary\n`, // no message types: by name only
	} {
		if !regexp.MustCompile(re).MatchString(r.out) {
			t.Errorf("list output does not match %s:\n%s", re, r.out)
		}
	}
	// Services in order, each followed by its methods.
	var services []string
	for _, l := range strings.Split(strings.TrimSpace(r.out), "\n") {
		if !strings.HasPrefix(l, " ") {
			services = append(services, strings.Fields(l)[0])
		}
	}
	if want := []string{"Echo", "kernrpc.Health", "kernrpc.echo.EchoService", "kernrpc.reflection.v1.Reflection"}; !slices.Equal(services, want) {
		t.Errorf("list showed services %q, want %q", services, want)
	}
	one := runCmd("", "list", addr, "kernrpc.echo.EchoService")
	one.check(t, "list SERVICE", 0, echoM)
	if strings.Contains(one.out, "Health") {
		t.Errorf("list SERVICE showed other services:\n%s", one.out)
	}
	runCmd("", "list", addr, "kernrpc.nope").check(t, "list an unknown service", 1, `unknown service "kernrpc.nope"`, "known: Echo, kernrpc.Health")
	runCmd("", "list", "127.0.0.1:1", "-timeout", "300ms").check(t, "list an address nobody serves", 1, "reflection: list services")
}

func TestListWithoutReflection(t *testing.T) {
	cfg := writeConfig(t, serveConfig)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve", "-config", cfg, "-reflection=false"}, &out, &errOut) }()
	defer func() { cancel(); <-done }()
	addrRE := regexp.MustCompile(`serving \S+ on (\S+) `)
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("serve did not start: %s", errOut.String())
	}
	runCmd("", "list", addr).check(t, "list a server without reflection", 1, "Unimplemented", "server.reflection: true")
}

func TestDescribeAgainstServe(t *testing.T) {
	addr := startServe(t, serveConfig)
	runCmd("", "describe", addr, "kernrpc.echo.EchoService").check(t, "describe SERVICE", 0,
		"// kernrpc.echo.EchoService is a service (internal/echopb/echo.proto)",
		"service EchoService {\n  rpc Echo(.kernrpc.echo.Echo) returns (.kernrpc.echo.Echo);\n}")
	runCmd("", "describe", addr, echoM).check(t, "describe METHOD", 0,
		"is a unary method of kernrpc.echo.EchoService",
		"message Echo {\n  bytes payload = 1;\n  string text = 2;\n}")
	runCmd("", "describe", addr, "kernrpc.echo.Echo").check(t, "describe MESSAGE", 0, "// kernrpc.echo.Echo is a message", "string text = 2;")
	for _, tc := range []struct{ name, want string }{
		{"Echo", `service "Echo" is served by name only`},
		{"Echo.Echo", "served by name only"},
		{"kernrpc.echo.EchoService.Nope", "service kernrpc.echo.EchoService has Echo"},
		{"kernrpc.nope.Thing", "services: Echo, kernrpc.Health, kernrpc.echo.EchoService"},
		{"Nope", `"Nope": not found on the server; services: Echo, kernrpc.Health`},
	} {
		runCmd("", "describe", addr, tc.name).check(t, "describe "+tc.name, 1, tc.want)
	}
	runCmd("", "describe", addr).check(t, "describe without a name", 2, "Usage: kernrpc describe")
}

const notesSet = "../../internal/reflectpb/testpb/testdata/notes.protoset"

// list and describe read a descriptor set without any server.
func TestListAndDescribeAProtoset(t *testing.T) {
	r := runCmd("", "list", "-protoset", notesSet)
	r.check(t, "list -protoset", 0, "kernrpc.reflecttest.v1.Notes  ", "internal/reflectpb/testpb/service.proto")
	for _, re := range []string{
		`\n  kernrpc\.reflecttest\.v1\.Notes\.Chat +bidi-streaming +kernrpc\.reflecttest\.v1\.Note → kernrpc\.reflecttest\.v1\.Note\n`,
		`\n  kernrpc\.reflecttest\.v1\.Notes\.Split +server-streaming +kernrpc\.reflecttest\.v1\.Note → `,
	} {
		if !regexp.MustCompile(re).MatchString(r.out) {
			t.Errorf("list -protoset output does not match %s:\n%s", re, r.out)
		}
	}
	runCmd("", "describe", "-protoset", notesSet, "kernrpc.reflecttest.v1.Notes").check(t, "describe -protoset", 0,
		"rpc Split(.kernrpc.reflecttest.v1.Note) returns (stream .kernrpc.reflecttest.v1.Note);",
		"rpc Chat(stream .kernrpc.reflecttest.v1.Note) returns (stream .kernrpc.reflecttest.v1.Note);")
	runCmd("", "describe", "-protoset", notesSet, "kernrpc.reflecttest.v1.Note").check(t, "describe a nested message", 0,
		"message Note {\n  message Meta {\n    string author = 1;\n    .google.protobuf.Timestamp at = 2;\n  }\n",
		"  .kernrpc.reflecttest.v1.Color color = 3;", "  repeated string tags = 5;")
	runCmd("", "describe", "-protoset", notesSet, "kernrpc.reflecttest.v1.Color").check(t, "describe an enum", 0, "enum Color {\n  COLOR_UNSPECIFIED = 0;")
	bad := filepath.Join(t.TempDir(), "bad.protoset")
	if err := os.WriteFile(bad, []byte("not a descriptor set"), 0o644); err != nil {
		t.Fatal(err)
	}
	runCmd("", "list", "-protoset", bad).check(t, "a protoset that does not parse", 1, "bad descriptor set", bad)
	runCmd("", "list").check(t, "list with nothing to ask", 1, "pass ADDR")
}

func TestCallAgainstServe(t *testing.T) {
	addr := startServe(t, serveConfig)
	r := runCmd("", "call", addr, echoM, `{"text":"hi","payload":"AAE="}`, "-H", token)
	r.check(t, "call", 0)
	jsonIs(t, "call", r.out, `{"text":"hi","payload":"AAE="}`)

	reqFile := filepath.Join(t.TempDir(), "req.json")
	if err := os.WriteFile(reqFile, []byte(`{"text":"from a file"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stdin string
		args        []string
		want        string
	}{
		{"-d JSON", "", []string{"-H", token, "-d", `{"text":"d"}`, addr, echoM}, `{"text":"d"}`},
		{"-d @file", "", []string{"-H", token, "-d", "@" + reqFile, addr, echoM}, `{"text":"from a file"}`},
		{"@file argument", "", []string{addr, echoM, "@" + reqFile, "-H", token}, `{"text":"from a file"}`},
		{"standard input", `{"text":"piped"}`, []string{addr, echoM, "-", "-H", token}, `{"text":"piped"}`},
		{"-d - ", `{"text":"piped"}`, []string{"-d", "-", "-H", token, addr, echoM}, `{"text":"piped"}`},
		{"no request: the empty message", "", []string{addr, echoM, "-H", token}, `{}`},
		{"codec json", "", []string{"-codec", "json", addr, echoM, `{"text":"j"}`, "-H", token}, `{"text":"j"}`},
		{"-addr", "", []string{"-addr", addr, echoM, `{"text":"a"}`, "-H", token}, `{"text":"a"}`},
		{"a service name through -registry", "", []string{"-registry", "{name: memory, options: {static: {echo: [" + addr + "]}}}", "echo", echoM, `{"text":"r"}`, "-H", token}, `{"text":"r"}`},
		{"flags after --", "", []string{"-H", token, "--", addr, echoM, `{"text":"-H"}`}, `{"text":"-H"}`},
		{"a service name through -config", "", []string{"-config", writeConfig(t, "registry: {name: memory, options: {static: {echo: [\""+addr+"\"]}}}\n"), "echo", echoM, `{"text":"c"}`, "-H", token}, `{"text":"c"}`},
	} {
		r := runCmd(tc.stdin, append([]string{"call"}, tc.args...)...)
		r.check(t, "call "+tc.name, 0)
		if r.code == 0 {
			jsonIs(t, "call "+tc.name, r.out, tc.want)
		}
	}

	runCmd("", "call", addr, echoM, `{"text":"hi"}`).check(t, "call without the token", 1,
		"kernrpc.echo.EchoService.Echo failed", "code:    Unauthenticated", "message: auth: kernrpc.echo.EchoService.Echo needs a valid bearer token")
	runCmd("", "call", addr, echoM, `{"txt":"hi"}`, "-H", token).check(t, "call with an unknown field", 1, `unknown field "txt"`, "kernrpc.echo.Echo")
	runCmd("", "call", addr, echoM, `{"text":5}`, "-H", token).check(t, "call with a field of the wrong type", 1, "string field text: 5")
	runCmd("", "call", addr, echoM, `{"text":`, "-H", token).check(t, "call with broken JSON", 1, "bad JSON request")
	runCmd("", "call", addr, "kernrpc.echo.EchoService.Nope", `{}`).check(t, "call an unknown method", 1, "unknown method", "has Echo")
	runCmd("", "call", addr, "kernrpc.nope.Svc.M", `{}`).check(t, "call an unknown service", 1, `unknown service "kernrpc.nope.Svc"`)
	runCmd("", "call", addr, "Echo.Echo", `{}`).check(t, "call a method served by name only", 1, "served by name only")
	runCmd("", "call", addr, echoM, `{}`, "-d", `{}`).check(t, "call with the request twice", 2, "given twice")
	runCmd("", "call", addr, echoM, "@/nonexistent/req.json").check(t, "call with a missing request file", 1, "/nonexistent/req.json")
	runCmd("", "call", "-codec", "msgpack", addr, echoM, `{}`).check(t, "call in msgpack", 1, `-codec "msgpack"`)
	runCmd("", "call", "echo", echoM, `{}`).check(t, "call a service name without a registry", 1, "pass -registry or -config")
	runCmd("", "call", "-registry", "nope", "echo", echoM).check(t, "call through an unknown registry", 1, `registry "nope": no registry of that name`)
	runCmd("", "call", "-registry", "memory", "echo", echoM).check(t, "call through an in-process registry", 1, `registry "memory" lives inside one process`)
	runCmd("", "call", "-config", "/nonexistent/kernrpc.yaml", addr, echoM).check(t, "call with a missing config", 1, "/nonexistent/kernrpc.yaml")
	runCmd("", "call", "-H", "novalue", addr, echoM).check(t, "call with a bad -H", 2, `"novalue" is not key=value`)
	runCmd("", "call", addr).check(t, "call without a method", 2, "want ADDR SERVICE.METHOD")
	// A descriptor set of a service the server does not serve: the server
	// answers with its status.
	runCmd("", "call", "-protoset", notesSet, addr, "kernrpc.reflecttest.v1.Notes.Echo", `{"text":"x"}`).check(t, "call a method the server lacks", 1,
		"code:    Unimplemented", `method "kernrpc.reflecttest.v1.Notes.Echo" is not served here`)
}

// call works on each kind of streaming method: a server stream prints
// every message, a client or bidi stream sends each JSON value given (none
// without a request).
func TestCallStreams(t *testing.T) {
	cfg := kernrpc.DefaultConfig()
	cfg.Service = "notes"
	cfg.Registry.Options = map[string]any{"namespace": t.Name()}
	cfg.Server.Reflection = true
	srv, err := kernrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const notes = "kernrpc.reflecttest.v1.Notes."
	type st = kernrpc.ServerStreamOf[testpb.Note, testpb.Note]
	kernrpc.HandleServerStream(srv, notes+"Split", func(_ context.Context, n *testpb.Note, s st) error {
		for _, tag := range n.Tags {
			if tag == "fail" {
				return kernel.Errorf(kernel.FailedPrecondition, "no tag may say fail")
			}
			if err := s.Send(&testpb.Note{Text: tag}); err != nil {
				return err
			}
		}
		return nil
	})
	kernrpc.HandleClientStream(srv, notes+"Join", func(_ context.Context, s st) (*testpb.Note, error) {
		var texts []string
		for {
			n, err := s.Recv()
			if err == io.EOF {
				return &testpb.Note{Text: strings.Join(texts, "+"), Tags: []string{strconv.Itoa(len(texts))}}, nil
			}
			if err != nil {
				return nil, err
			}
			texts = append(texts, n.Text)
		}
	})
	kernrpc.HandleBidiStream(srv, notes+"Chat", func(_ context.Context, s st) error {
		for {
			n, err := s.Recv()
			if err != nil {
				return nil
			}
			if n.Text == "stop" {
				return kernel.Errorf(kernel.Aborted, "the chat stops here")
			}
			if err := s.Send(&testpb.Note{Text: "re: " + n.Text}); err != nil {
				return err
			}
		}
	})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	addr := srv.Addr()

	r := runCmd("", "call", addr, notes+"Split", `{"tags":["a","b"]}`)
	r.check(t, "call a server stream", 0)
	if got := strings.Join(strings.Fields(r.out), ""); got != `{"text":"a"}{"text":"b"}` {
		t.Errorf("Split printed %q", r.out)
	}
	r = runCmd(`{"text":"x"} {"text":"y"}`+"\n"+`{"text":"z"}`, "call", addr, notes+"Join", "-")
	r.check(t, "call a client stream", 0)
	jsonIs(t, "Join", r.out, `{"text":"x+y+z","tags":["3"]}`)
	// Without a request, a client stream sends no message, not one empty.
	r = runCmd("", "call", addr, notes+"Join")
	r.check(t, "call a client stream without a request", 0)
	jsonIs(t, "Join without a request", r.out, `{"tags":["0"]}`)
	r = runCmd("", "call", addr, notes+"Chat", `{"text":"1"}{"text":"2"}`)
	r.check(t, "call a bidi stream", 0)
	if got := strings.Join(strings.Fields(r.out), ""); got != `{"text":"re:1"}{"text":"re:2"}` {
		t.Errorf("Chat printed %q", r.out)
	}
	runCmd("", "call", addr, notes+"Join", `{"text":"x"} {"txt":"y"}`).check(t, "a client stream with a bad message", 1, "message 2 of the stream", `unknown field "txt"`)
	runCmd("", "call", addr, notes+"Split", `{"tagz":[]}`).check(t, "a server stream with bad JSON", 1, `unknown field "tagz"`)
	runCmd("", "bench", addr, notes+"Split", `{}`, "-d", "1s").check(t, "bench a stream", 1, "bench calls unary methods")

	// A stream the server ends with an error: what came before it is
	// printed, then the status, and call exits 1.
	r = runCmd("", "call", addr, notes+"Split", `{"tags":["a","fail","b"]}`)
	r.check(t, "a server stream that fails", 1, "code:    FailedPrecondition", "no tag may say fail")
	if !strings.Contains(r.out, `"a"`) || strings.Contains(r.out, `"b"`) {
		t.Errorf("a server stream failing after a: printed %q, want a only", r.out)
	}
	// Values still being sent when the server ends the stream are dropped
	// quietly: the status says why.
	many := strings.Repeat(`{"text":"more"}`, 1000)
	r = runCmd("", "call", addr, notes+"Chat", `{"text":"1"}{"text":"stop"}`+many)
	r.check(t, "a bidi stream the server ends", 1, "code:    Aborted", "the chat stops here")
	if got := strings.Join(strings.Fields(r.out), ""); got != `{"text":"re:1"}` {
		t.Errorf("a bidi stream ended after its first answer printed %q", r.out)
	}
}

func TestBenchAgainstServe(t *testing.T) {
	addr := startServe(t, serveConfig)
	r := runCmd("", "bench", addr, echoM, `{"text":"load"}`, "-c", "4", "-d", "1s", "-H", token)
	r.check(t, "bench", 0, "method    "+echoM, "callers   4", "QPS", "p50", "p90", "p99", "max", "code  calls")
	m := regexp.MustCompile(`calls +(\d+) \((\d+) OK, 0 errors\)`).FindStringSubmatch(r.out)
	if m == nil || m[1] != m[2] || m[1] == "0" {
		t.Errorf("bench's calls line is not N (N OK, 0 errors) with N > 0:\n%s", r.out)
	}
	if !regexp.MustCompile(`\n(OK +` + m[1] + `)`).MatchString(r.out) {
		t.Errorf("bench's codes table does not count the %s calls OK:\n%s", m[1], r.out)
	}
	if !regexp.MustCompile(`1s/1s  ` + regexp.QuoteMeta(echoM) + `: \d+ calls, \d+/s now, 0 errors`).MatchString(r.stderr) {
		t.Errorf("bench printed no progress line on stderr: %q", r.stderr)
	}

	// JSON, and calls that fail, counted by code with their message.
	r = runCmd("", "bench", "-o", "json", "-c", "2", "-n", "50", "-d", "0", addr, echoM, `{}`)
	r.check(t, "bench -o json of failing calls", 1, "no call of "+echoM+" succeeded")
	var res struct {
		Calls, OK, Errors int64
		Codes             map[string]int64
		Examples          map[string]string          `json:"error_examples"`
		Latency           struct{ P50, Max float64 } `json:"latency_us"`
	}
	if err := json.Unmarshal([]byte(r.out), &res); err != nil {
		t.Fatalf("bench -o json printed %q: %v", r.out, err)
	}
	if res.Calls != 50 || res.OK != 0 || res.Errors != 50 || res.Codes["Unauthenticated"] != 50 || !strings.Contains(res.Examples["Unauthenticated"], "bearer token") {
		t.Errorf("bench -o json: %+v, want 50 calls, all Unauthenticated", res)
	}
	r = runCmd("", "bench", "-o", "json", "-n", "20", "-d", "0", "-H", token, addr, echoM)
	r.check(t, "bench -n", 0)
	if err := json.Unmarshal([]byte(r.out), &res); err != nil || res.Calls != 20 || res.OK != 20 || res.Latency.P50 <= 0 || res.Latency.Max < res.Latency.P50 {
		t.Errorf("bench -n 20: %+v, %v", res, err)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-c", "0"}, 2, "want at least 1 caller"},
		{[]string{"-d", "0"}, 2, "want a positive duration"},
		{[]string{"-o", "yaml"}, 2, `-o "yaml"`},
		{[]string{"-pool", "-1"}, 2, "-pool -1"},
		{[]string{"-timeout", "0s"}, 2, "a timeout above zero"},
		{[]string{"-timeout", "soon"}, 2, `"soon" is not a duration`},
	} {
		runCmd("", append([]string{"bench", addr, echoM}, tc.args...)...).check(t, "bench "+strings.Join(tc.args, " "), tc.code, tc.want)
	}
	runCmd("", "bench", addr, echoM, `{"txt":1}`, "-d", "1s").check(t, "bench with bad JSON", 1, `unknown field "txt"`)
	runCmd("", "bench", addr).check(t, "bench without a method", 2, "missing arguments")
}

func TestHealthByAddress(t *testing.T) {
	addr := startServe(t, serveConfig)
	runCmd("", "health", addr).check(t, "health ADDR", 0, "SERVING")
	runCmd("", "health", addr, "echo").check(t, "health ADDR SERVICE", 0, "SERVING")
	runCmd("", "health", addr, "nosuch").check(t, "health ADDR of a service not served", 1, "NotFound", addr+" is not serving")
	runCmd("", "health", addr, "-addr", addr).check(t, "health with the address twice", 2, "given twice")
	runCmd("", "health", "127.0.0.1:1", "-timeout", "300ms").check(t, "health of an address nobody serves", 1, "ERROR")
	runCmd("", "health", addr, "-timeout", "-1s").check(t, "health with a negative timeout", 2, "a timeout above zero")
}

func TestParseAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		n    int
	}{
		{[]string{"a", "-n", "3", "b"}, []string{"a", "b"}, 3},
		{[]string{"-n", "4", "a", "b"}, []string{"a", "b"}, 4},
		{[]string{"a", "b", "-n=5"}, []string{"a", "b"}, 5},
		{[]string{"a", "--", "-n", "6"}, []string{"a", "-n", "6"}, 0},
		{[]string{"-", "a"}, []string{"-", "a"}, 0},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		n := fs.Int("n", 0, "")
		pos, err := parseAnywhere(fs, tc.args, 0, -1)
		if err != nil || !slices.Equal(pos, tc.pos) || *n != tc.n {
			t.Errorf("parseAnywhere(%q): %q, -n %d, %v; want %q, -n %d", tc.args, pos, *n, err, tc.pos, tc.n)
		}
	}
}
