package all_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kernrpc/kernrpc/kernel"
	_ "github.com/kernrpc/kernrpc/plugins/all"
)

// packageDocs maps each config name a package doc under plugins/ declares
// ("Config name: "retry"") to that doc, the comment before its package
// clause.
func packageDocs(t *testing.T) map[string]string {
	t.Helper()
	name := regexp.MustCompile(`Config name: "([^"]+)"`)
	docs := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		doc, _, ok := strings.Cut(string(src), "\npackage ")
		if !ok {
			return nil
		}
		if m := name.FindStringSubmatch(doc); m != nil {
			docs[m[1]] = doc
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// docOption is one "key: value  # comment" line of a package doc's
// options block, at the block's top level.
var docOption = regexp.MustCompile(`^//\t(\s*)([a-z][a-z_0-9]*):(?: (.*?))?\s*(?:#.*)?$`)

// docOptions reads the options: blocks of a package doc: each top-level
// key with the value the doc gives it ("" for a nested block).
func docOptions(doc string) map[string]string {
	opts := map[string]string{}
	in, indent := false, -1
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "//\t") && strings.TrimSpace(strings.TrimPrefix(l, "//\t")) == "options:" {
			in, indent = true, -1
			continue
		}
		if !in {
			continue
		}
		m := docOption.FindStringSubmatch(l)
		if m == nil {
			if !strings.HasPrefix(l, "//\t") {
				in = false
			}
			continue
		}
		if indent < 0 {
			indent = len(m[1])
		}
		if len(m[1]) < indent {
			in = false // the next entry of the config, not an option
			continue
		}
		if len(m[1]) == indent {
			opts[m[2]] = m[3]
		}
	}
	return opts
}

// Every codec, registry, balancer and filter documents its options in its
// package doc as a config block ("options:", then "key: default  #
// meaning"): the docs (docs/governance.md, docs/plugins.md) send readers
// there for every option and default. Each option the plugin takes is
// listed, each listed key is one it takes, and each default given is the
// one DefaultOptions has: decoded as a config would give it, it leaves the
// defaults as they were.
func TestPackageDocsListEveryOptionWithItsDefault(t *testing.T) {
	docs := packageDocs(t)
	checked := 0
	for _, p := range kernel.Plugins() {
		if p.Kind == kernel.KindTransport {
			continue // the transports' docs are tables, not config blocks
		}
		doc, ok := docs[p.Name]
		if !ok {
			t.Errorf("%s %q: no package doc under plugins/ says Config name: %q", p.Kind, p.Name, p.Name)
			continue
		}
		if p.Defaults == nil {
			continue
		}
		checked++
		listed := docOptions(doc)
		defaults := jsonFields(t, p.Defaults)
		for key := range defaults {
			if _, ok := listed[key]; !ok {
				t.Errorf("%s %q: option %q is not in the package doc's options block", p.Kind, p.Name, key)
			}
		}
		for key, value := range listed {
			if _, ok := defaults[key]; !ok {
				t.Errorf("%s %q: the package doc lists option %q, which the plugin does not take", p.Kind, p.Name, key)
				continue
			}
			if value == "" || strings.Contains(value, "<") {
				continue // a nested block, or a placeholder such as <program name>
			}
			var v any
			if err := yaml.Unmarshal([]byte(value), &v); err != nil {
				t.Errorf("%s %q: option %q: the package doc's default %q is not YAML: %v", p.Kind, p.Name, key, value, err)
				continue
			}
			opts := reflect.New(reflect.TypeOf(p.Defaults).Elem()).Interface()
			raw, _ := json.Marshal(p.Defaults)
			if err := json.Unmarshal(raw, opts); err != nil {
				t.Fatal(err)
			}
			if err := kernel.DecodeOptions(map[string]any{key: v}, opts); err != nil {
				t.Errorf("%s %q: option %q: the package doc's default %q does not decode: %v", p.Kind, p.Name, key, value, err)
				continue
			}
			if got, want := jsonFields(t, opts)[key], defaults[key]; !sameValue(got, want) {
				t.Errorf("%s %q: option %q: the package doc says the default is %s, DefaultOptions has %s", p.Kind, p.Name, key, got, want)
			}
		}
	}
	if checked < 15 {
		t.Errorf("checked the options of %d plugins; want every built-in codec, registry, balancer and filter with options", checked)
	}
}

// jsonFields is v's JSON encoding, by top-level key.
func jsonFields(t *testing.T, v any) map[string]json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// sameValue compares two JSON encodings, an empty list or map being the
// same as null.
func sameValue(a, b json.RawMessage) bool {
	norm := func(r json.RawMessage) string {
		switch s := string(r); s {
		case "[]", "{}", "":
			return "null"
		default:
			return s
		}
	}
	return norm(a) == norm(b)
}
