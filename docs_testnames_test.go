package kernrpc_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsNameRealTests keeps the docs honest: every test README.md or a
// file in docs/ names (docs/reliability.md as the proof of each limit)
// exists in the repository.
func TestDocsNameRealTests(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	testName := regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`")
	named := map[string][]string{} // doc file: the tests it names
	for _, path := range append(docs, "README.md") {
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllStringSubmatch(string(doc), -1) {
			named[path] = append(named[path], m[1])
		}
	}
	if n := len(named["docs/reliability.md"]); n < 10 {
		t.Fatalf("docs/reliability.md names %d tests; its tables should name the test of every limit", n)
	}
	defined := map[string]bool{}
	funcRE := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for path, tests := range named {
		for _, name := range tests {
			if !defined[name] {
				t.Errorf("%s names %s, which no _test.go file in the repository defines; rename it in the doc or restore the test", path, name)
			}
		}
	}
}

// TestEveryPluginRunsItsConformanceSuite keeps docs/plugins.md's promise
// that every built-in plugin runs its kind's plugintest suite in its own
// package as TestConformance, so that go test -run TestConformance
// certifies them all: each directory under plugins/<kind>/ has, in a
// _test.go file of its own tree, a func TestConformance calling
// plugintest.<Kind>.
func TestEveryPluginRunsItsConformanceSuite(t *testing.T) {
	suites := map[string]string{
		"transport": "Transport", "codec": "Codec", "registry": "Registry",
		"balancer": "Balancer", "filter": "Filter",
	}
	funcRE := regexp.MustCompile(`(?ms)^func TestConformance\(t \*testing\.T\) \{\n(.*?)^\}`)
	checked := 0
	for kind, suite := range suites {
		dirs, err := filepath.Glob(filepath.Join("plugins", kind, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range dirs {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				continue
			}
			checked++
			found := false
			err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") || found {
					return err
				}
				src, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				m := funcRE.FindSubmatch(src)
				if m == nil {
					return nil
				}
				if !strings.Contains(string(m[1]), "plugintest."+suite+"(") {
					t.Errorf("%s: TestConformance does not call plugintest.%s", path, suite)
				}
				found = true
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !found {
				t.Errorf("%s: no TestConformance in its tests; docs/plugins.md says every built-in plugin runs its kind's suite as TestConformance (rename the test that calls plugintest.%s)", dir, suite)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d plugin directories; want every built-in plugin's", checked)
	}
}
