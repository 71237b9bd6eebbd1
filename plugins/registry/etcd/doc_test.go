package etcd

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
)

// docBlocks returns the fenced blocks of docs/registry-etcd.md in language
// lang.
func docBlocks(t *testing.T, lang string) []string {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/registry-etcd.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("docs/registry-etcd.md has no %s block", lang)
	}
	return out
}

// TestDocConfig: the config in docs/registry-etcd.md loads, and its
// options decode and validate as the etcd registry's.
func TestDocConfig(t *testing.T) {
	for _, block := range docBlocks(t, "yaml") {
		cfg, err := kernrpc.ParseConfig([]byte(block), "registry-etcd.yaml")
		if err != nil {
			t.Fatalf("the doc's config does not load: %v\n%s", err, block)
		}
		if cfg.Registry.Name != Name {
			t.Fatalf("the doc's config names registry %q; want %q", cfg.Registry.Name, Name)
		}
		opts := DefaultOptions()
		if err := kernel.DecodeOptions(cfg.Registry.Options, opts); err != nil {
			t.Fatal(err)
		}
		if _, err := opts.check(); err != nil {
			t.Errorf("the doc's options do not validate: %v", err)
		}
	}
}

// TestDocSnippets: the doc's import names this module, and its JSON value
// is what decodeInstance reads.
func TestDocSnippets(t *testing.T) {
	for _, block := range docBlocks(t, "go") {
		if !strings.Contains(block, `"github.com/kernrpc/kernrpc/plugins/registry/etcd"`) {
			t.Errorf("the doc's Go block does not import this module: %s", block)
		}
	}
	for _, block := range docBlocks(t, "json") {
		in, err := decodeInstance("echo", "/p/echo/", []byte("/p/echo/a"), []byte(block))
		if err != nil {
			t.Fatalf("the doc's value does not decode: %v\n%s", err, block)
		}
		if in.Address == "" || in.Metadata["transport"] == "" || in.Load.InFlight == 0 || in.Load.Updated.IsZero() {
			t.Errorf("the doc's value decodes to %+v; want address, metadata and load", in)
		}
		back, err := encodeInstance(in)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeInstance("echo", "/p/echo/", []byte("/p/echo/a"), []byte(back))
		if err != nil || again.Address != in.Address || !again.Load.Updated.Equal(in.Load.Updated) || again.Load.QPS != in.Load.QPS {
			t.Errorf("round trip of the doc's value: %+v, %v; want %+v", again, err, in)
		}
	}
}
