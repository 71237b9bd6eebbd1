package consultest_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/registry/consul"
)

// TestDocsConfig loads the config of docs/registry-consul.md as a kernrpc
// config and builds the registry from it, so that the page shows options
// that exist with values the plugin takes.
func TestDocsConfig(t *testing.T) {
	md, err := os.ReadFile("../../../../docs/registry-consul.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(md, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/registry-consul.md has no yaml block")
	}
	for _, b := range blocks {
		cfg, err := kernrpc.ParseConfig(b[1], "registry-consul.yaml")
		if err != nil {
			t.Fatalf("the page's config: %v", err)
		}
		if cfg.Registry.Name != consul.Name {
			t.Fatalf("the page's config names registry %q", cfg.Registry.Name)
		}
		r, err := kernel.NewRegistry(cfg.Registry.Name, cfg.Registry.Options, "docs/registry-consul.md")
		if err != nil {
			t.Fatalf("building the registry of the page's config: %v", err)
		}
		r.Close()
	}
}
