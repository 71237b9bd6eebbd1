package oteltracing_test

import (
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/plugins/filter/oteltracing"
)

// tracingSection is the Tracing section of docs/observability.md, the part
// this filter owns: up to the next section of the same level.
func tracingSection(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Tracing\n")
	if start < 0 {
		t.Fatal("docs/observability.md has no ## Tracing section")
	}
	sec := doc[start+1:]
	if end := strings.Index(sec[3:], "\n## "); end >= 0 {
		sec = sec[:end+3]
	}
	return sec
}

var yamlFence = regexp.MustCompile("(?s)```yaml( otelcol)?\n(.*?)```")

// The section's kernrpc config loads, as a config file does, and every
// otel-tracing entry in it builds (and closes); its collector config is
// YAML with an OTLP receiver; its options table lists every option.
func TestDocsTracingSection(t *testing.T) {
	sec := tracingSection(t)
	configs, collectors := 0, 0
	for _, m := range yamlFence.FindAllStringSubmatch(sec, -1) {
		if m[1] == " otelcol" {
			collectors++
			var c struct {
				Receivers map[string]struct {
					Protocols map[string]map[string]string
				}
			}
			if err := yaml.Unmarshal([]byte(m[2]), &c); err != nil {
				t.Errorf("the collector config does not parse: %v", err)
			}
			if c.Receivers["otlp"].Protocols["grpc"]["endpoint"] == "" || c.Receivers["otlp"].Protocols["http"]["endpoint"] == "" {
				t.Errorf("the collector config has no OTLP receiver over gRPC and HTTP: %+v", c)
			}
			continue
		}
		configs++
		cfg, err := kernrpc.ParseConfig([]byte(m[2]), "observability-tracing.yaml")
		if err != nil {
			t.Errorf("the config in docs/observability.md does not load: %v", err)
			continue
		}
		entries := 0
		for _, fc := range cfg.Filters {
			if fc.Name != oteltracing.Name {
				continue
			}
			entries++
			f, err := oteltracing.Factory.Build(fc.Options, "observability-tracing.yaml")
			if err != nil {
				t.Errorf("entry %v does not build: %v", fc, err)
				continue
			}
			if c, ok := f.(io.Closer); ok {
				_ = c.Close()
			}
		}
		if entries != 2 {
			t.Errorf("the config has %d otel-tracing entries, want the call and the attempt entries", entries)
		}
	}
	if configs != 1 || collectors != 1 {
		t.Errorf("%d kernrpc configs and %d collector configs in the section, want one of each", configs, collectors)
	}
	for _, name := range optionNames() {
		if !strings.Contains(sec, "| `"+name+"` |") {
			t.Errorf("the options table does not list %q", name)
		}
	}
}

// optionNames are the options a config can set.
func optionNames() []string {
	var names []string
	typ := reflect.TypeFor[oteltracing.Options]()
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("json"); tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}

// The package doc lists every option too.
func TestPackageDocListsEveryOption(t *testing.T) {
	src, err := os.ReadFile("oteltracing.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := strings.Cut(string(src), "\npackage ")
	for _, name := range optionNames() {
		if !regexp.MustCompile(`(?m)^//\s+` + name + `: `).MatchString(doc) {
			t.Errorf("the package doc does not list option %q with its default", name)
		}
	}
}
