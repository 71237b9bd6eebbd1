package kernrpc_test

// Every ```go block in the repository's Markdown must compile. A block is
// either a complete Go file, which TestDocSnippets writes into a scratch
// package inside the module and vets, or a fragment whose Markdown names
// the file it is taken from:
//
//	<!-- snippet: examples/headerstamp/headerstamp.go -->
//	```go
//	func init() { kernel.RegisterFilter(Factory) }
//	```
//
// on one of the lines just before the fence (the path is from the
// repository root). A fragment's non-blank lines, trimmed, must appear in
// that file in order, consecutively except where the fragment has a line
// "...", which stands for any lines. The file is built by the normal build,
// so the fragment compiles too.

import (
	"bytes"
	"errors"
	"fmt"
	"go/parser"
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	File   string // the Markdown file, slash-separated from the repository root
	Line   int    // the line of the opening fence, from 1
	Code   string // the block's text, without the fence's indentation
	Source string // the file a <!-- snippet: ... --> comment names; "" if none
}

func (s snippet) where() string { return fmt.Sprintf("%s:%d", s.File, s.Line) }

// complete reports whether the block is a whole Go file: its first token,
// after comments, is the package clause.
func (s snippet) complete() bool {
	var sc scanner.Scanner
	fset := token.NewFileSet()
	src := []byte(s.Code)
	sc.Init(fset.AddFile("", -1, len(src)), src, nil, 0) // comments are skipped
	_, tok, _ := sc.Scan()
	return tok == token.PACKAGE
}

var snippetComment = regexp.MustCompile(`^<!--\s*snippet:\s*(\S+)\s*-->$`)

// snippetLookback is how many lines before a fence may hold its snippet
// comment.
const snippetLookback = 3

// extractSnippets returns the ```go blocks of a Markdown text. file names
// it in the snippets and errors. Other blocks are skipped, fences inside
// them included.
func extractSnippets(file, text string) ([]snippet, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	var out []snippet
	for i := 0; i < len(lines); i++ {
		indent, fence, info, ok := openingFence(lines[i])
		if !ok {
			continue
		}
		start := i
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			if isClosingFence(lines[i], fence) {
				closed = true
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if !closed {
			return out, fmt.Errorf("%s:%d: a code fence %s is never closed", file, start+1, fence)
		}
		if lang := strings.ToLower(firstField(info)); lang != "go" && lang != "golang" {
			continue
		}
		s := snippet{File: file, Line: start + 1, Code: strings.Join(body, "\n") + "\n"}
		for j := start - 1; j >= 0 && j >= start-snippetLookback; j-- {
			l := strings.TrimSpace(lines[j])
			if _, _, _, isFence := openingFence(lines[j]); isFence || strings.HasPrefix(l, "```") || strings.HasPrefix(l, "~~~") {
				break
			}
			if m := snippetComment.FindStringSubmatch(l); m != nil {
				s.Source = m[1]
				break
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// openingFence parses a line opening a fenced code block: its indentation,
// the fence (``` or ~~~, three or more) and the info string.
func openingFence(line string) (indent, fence, info string, ok bool) {
	rest := strings.TrimLeft(line, " \t")
	indent = line[:len(line)-len(rest)]
	for _, c := range []byte{'`', '~'} {
		n := 0
		for n < len(rest) && rest[n] == c {
			n++
		}
		if n >= 3 {
			info = strings.TrimSpace(rest[n:])
			if c == '`' && strings.Contains(info, "`") {
				return "", "", "", false // inline code, not a fence
			}
			return indent, rest[:n], info, true
		}
	}
	return "", "", "", false
}

// isClosingFence reports whether line closes a block opened by fence: the
// same character, at least as many times, and nothing else.
func isClosingFence(line, fence string) bool {
	l := strings.TrimSpace(line)
	return len(l) >= len(fence) && strings.Trim(l, fence[:1]) == ""
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return strings.TrimPrefix(f[0], "{.") // {.go} attribute style
	}
	return ""
}

// checkFragment checks that a fragment's non-blank lines appear in source
// (the text of the file its snippet comment names) in order: runs of lines
// between "..." lines must each appear consecutively among source's
// non-blank lines.
func checkFragment(s snippet, source string) error {
	var have []string
	for l := range strings.Lines(source) {
		if l = strings.TrimSpace(l); l != "" {
			have = append(have, l)
		}
	}
	// groups of consecutive fragment lines, with the Markdown line of each
	type line struct {
		text string
		md   int
	}
	var groups [][]line
	cur := []line{}
	n := 0
	for l := range strings.Lines(s.Code) {
		n++
		l = strings.TrimSpace(l)
		switch l {
		case "":
		case "...":
			if len(cur) > 0 {
				groups = append(groups, cur)
			}
			cur = []line{}
		default:
			cur = append(cur, line{l, s.Line + n})
		}
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	if len(groups) == 0 {
		return fmt.Errorf("%s: the ```go block is empty", s.where())
	}
	at := 0 // the first line of have not yet matched
	for _, g := range groups {
		found := -1
	search:
		for i := at; i+len(g) <= len(have); i++ {
			for k, l := range g {
				if have[i+k] != l.text {
					continue search
				}
			}
			found = i
			break
		}
		if found < 0 {
			// Say which line parted from the source: the longest prefix of
			// the group that does appear after the previous match.
			bad := g[0]
			for k := 1; k <= len(g); k++ {
				if !containsRun(have[at:], g[:k], func(l line) string { return l.text }) {
					bad = g[k-1]
					break
				}
			}
			return fmt.Errorf("%s: the fragment names %s as its source (<!-- snippet: %s -->), but its line %d, %q, does not appear there where the fragment puts it (after the lines before it, or after a \"...\" line). Copy the fragment from the file again, or mark a gap with a line \"...\"",
				s.where(), s.Source, s.Source, bad.md, bad.text)
		}
		at = found + len(g)
	}
	return nil
}

// containsRun reports whether run appears consecutively in have.
func containsRun[T any](have []string, run []T, text func(T) string) bool {
outer:
	for i := 0; i+len(run) <= len(have); i++ {
		for k, r := range run {
			if have[i+k] != text(r) {
				continue outer
			}
		}
		return true
	}
	return false
}

// checkSnippets checks every block of one Markdown file except by
// compiling: fragments against their sources (read with readSource, path
// from the repository root) and complete files by parsing them. It returns
// the complete files left to compile, and the problems found.
func checkSnippets(snippets []snippet, readSource func(path string) (string, error)) (compile []snippet, errs []error) {
	for _, s := range snippets {
		switch {
		case s.Source != "":
			if !strings.HasSuffix(s.Source, ".go") || filepath.IsAbs(s.Source) || strings.HasPrefix(filepath.Clean(s.Source), "..") {
				errs = append(errs, fmt.Errorf("%s: <!-- snippet: %s --> must name a .go file by its path from the repository root", s.where(), s.Source))
				continue
			}
			src, err := readSource(s.Source)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: the fragment's source %s cannot be read (%v); name the .go file it comes from, by its path from the repository root", s.where(), s.Source, err))
				continue
			}
			if err := checkFragment(s, src); err != nil {
				errs = append(errs, err)
			}
		case s.complete():
			if _, err := parser.ParseFile(token.NewFileSet(), "snippet.go", s.Code, parser.SkipObjectResolution); err != nil {
				errs = append(errs, fmt.Errorf("%s: the ```go block does not parse: %v", s.where(), shiftLines(err.Error(), s)))
				continue
			}
			compile = append(compile, s)
		default:
			errs = append(errs, fmt.Errorf("%s: this ```go block is a fragment that names no source, so nothing checks that it compiles. "+
				"Make it a complete Go file (a package clause and its imports), which this test compiles, or put "+
				"<!-- snippet: path/to/file.go --> (the path from the repository root) on a line just before the fence, "+
				"naming the file whose lines it shows", s.where()))
		}
	}
	return compile, errs
}

// posInSnippet matches "snippet.go:LINE:COL" and "DIR/main.go:LINE:COL" in
// compiler and parser messages.
var posInSnippet = regexp.MustCompile(`(?:\S*/)?(?:snippet|main)\.go:(\d+)(:\d+)?`)

// shiftLines rewrites the positions in a message about a snippet's code
// into positions in its Markdown file.
func shiftLines(msg string, s snippet) string {
	return posInSnippet.ReplaceAllStringFunc(msg, func(m string) string {
		sub := posInSnippet.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[1])
		return fmt.Sprintf("%s:%d", s.File, s.Line+n)
	})
}

// compileSnippets writes each complete snippet into a package of its own
// under a fresh directory in the module at root (its name begins with "_",
// so ./... skips it) and runs go vet on them all in one invocation, with
// the toolchain running the test. It returns one error per snippet that
// does not compile or vet, plus any output it cannot attribute to one.
func compileSnippets(t *testing.T, root string, snippets []snippet) []error {
	t.Helper()
	if len(snippets) == 0 {
		return nil
	}
	dir, err := os.MkdirTemp(root, "_snippets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	byPkg := make(map[string]snippet)
	args := []string{"vet"}
	for i, s := range snippets {
		name := fmt.Sprintf("s%02d_%s_%d", i, strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, s.File), s.Line)
		pkg := filepath.Join(dir, name)
		if err := os.Mkdir(pkg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, "main.go"), []byte(s.Code), 0o644); err != nil {
			t.Fatal(err)
		}
		byPkg[name] = s
		args = append(args, "./"+filepath.ToSlash(filepath.Join(filepath.Base(dir), name)))
	}
	cmd := exec.Command("go", args...) // go test puts its own GOROOT/bin first on PATH
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("go vet of %d snippets took %v", len(snippets), time.Since(start).Round(time.Millisecond))
	if runErr == nil {
		return nil
	}
	// Attribute each line of output to the snippet whose package it names.
	perSnippet := make(map[string][]string)
	var order []string
	var stray []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		owner := ""
		for name := range byPkg {
			if strings.Contains(l, "/"+name+"/") || strings.HasSuffix(l, "/"+name) || strings.Contains(l, "/"+name+"]") {
				owner = name
				break
			}
		}
		switch {
		case owner == "":
			stray = append(stray, l)
		case strings.HasPrefix(l, "# "):
			// the package header go vet prints before its messages
		default:
			if _, seen := perSnippet[owner]; !seen {
				order = append(order, owner)
			}
			perSnippet[owner] = append(perSnippet[owner], shiftLines(l, byPkg[owner]))
		}
	}
	var errs []error
	for _, name := range order {
		s := byPkg[name]
		errs = append(errs, fmt.Errorf("%s: the ```go block, a complete file, does not compile or vet:\n\t%s", s.where(), strings.Join(perSnippet[name], "\n\t")))
	}
	if len(errs) == 0 || len(stray) > 0 && !allHeaders(stray) {
		errs = append(errs, fmt.Errorf("go %s: %v:\n%s", strings.Join(args, " "), runErr, out.String()))
	}
	return errs
}

func allHeaders(lines []string) bool {
	for _, l := range lines {
		if !strings.HasPrefix(l, "# ") {
			return false
		}
	}
	return true
}

// repoMarkdown returns the repository's root and its Markdown files
// (markdownFiles).
func repoMarkdown(t *testing.T) (root string, files []string) {
	t.Helper()
	root, err := os.Getwd() // the package directory: the repository root
	if err != nil {
		t.Fatal(err)
	}
	files, err = markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, files
}

// markdownFiles lists the repository's Markdown files, slash-separated
// from root, leaving out benchmark results and directories the go command
// ignores (testdata, names beginning with "." or "_").
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || rel == "benchmarks/results") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// TestDocSnippets checks every ```go block of every Markdown file in the
// repository: complete files compile and vet, fragments match the file
// they name.
func TestDocSnippets(t *testing.T) {
	root, files := repoMarkdown(t)
	readSource := func(path string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
		return string(b), err
	}
	var all []snippet
	var errs []error
	for _, f := range files {
		text, err := readSource(f)
		if err != nil {
			t.Fatal(err)
		}
		snippets, err := extractSnippets(f, text)
		if err != nil {
			errs = append(errs, err)
		}
		all = append(all, snippets...)
	}
	compile, problems := checkSnippets(all, readSource)
	errs = append(errs, problems...)
	fragments := 0
	for _, s := range all {
		if s.Source != "" {
			fragments++
		}
	}
	t.Logf("%d Markdown files, %d ```go blocks: %d fragments naming their source, %d complete files to compile", len(files), len(all), fragments, len(compile))
	if testing.Short() {
		t.Logf("-short: not compiling the %d complete files (parsed only)", len(compile))
	} else {
		errs = append(errs, compileSnippets(t, root, compile)...)
	}
	for _, err := range errs {
		t.Error(err)
	}
}

// TestSnippetCheckerCatchesBadSnippets runs the checker on Markdown written
// here, so that a checker which passes everything fails this test.
func TestSnippetCheckerCatchesBadSnippets(t *testing.T) {
	const md = "# Doc\n\n" +
		"A complete file with a type error:\n\n" +
		"```go\n// Command bad does not compile.\npackage main\n\nfunc main() {\n\tvar n int = \"seven\"\n\t_ = n\n}\n```\n\n" +
		"A fragment that names no source:\n\n" +
		"```go\nvar _ = 1\n```\n\n" +
		"A fragment of this very file, with a gap:\n\n" +
		"<!-- snippet: docs_test.go -->\n" +
		"```go\nfunc firstField(s string) string {\n\t...\n\treturn \"\"\n}\n```\n\n" +
		"A fragment whose lines are not in its source:\n\n" +
		"<!-- snippet: docs_test.go -->\n\n" +
		"```go\nfunc firstField(s string) string {\n\treturn \"nothing like this\"\n}\n```\n\n" +
		"A fragment naming a file that does not exist:\n\n" +
		"<!-- snippet: no/such/file.go -->\n" +
		"```go\nvar x int\n```\n\n" +
		"A shell block, not checked:\n\n" +
		"```sh\ngo test ./...\n```\n"
	snippets, err := extractSnippets("bad.md", md)
	if err != nil {
		t.Fatal(err)
	}
	if len(snippets) != 5 {
		t.Fatalf("found %d ```go blocks, want 5: %+v", len(snippets), snippets)
	}
	readSource := func(path string) (string, error) {
		b, err := os.ReadFile(filepath.FromSlash(path))
		return string(b), err
	}
	compile, errs := checkSnippets(snippets, readSource)
	want := []string{
		"bad.md:17: this ```go block is a fragment that names no source",
		`bad.md:35: the fragment names docs_test.go as its source (<!-- snippet: docs_test.go -->), but its line 37, "return \"nothing like this\"", does not appear there`,
		"bad.md:44: the fragment's source no/such/file.go cannot be read",
	}
	if len(errs) != len(want) {
		t.Errorf("the checker reported %d problems, want %d:\n%v", len(errs), len(want), errors.Join(errs...))
	}
	for i, w := range want {
		if i < len(errs) && !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("problem %d:\n\t%v\nwant it to begin\n\t%s", i, errs[i], w)
		}
	}
	if len(compile) != 1 || compile[0].Line != 5 {
		t.Fatalf("complete files to compile: %+v, want the one at line 5", compile)
	}
	if testing.Short() {
		t.Skip("-short: not compiling the broken snippet")
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cerrs := compileSnippets(t, root, compile)
	if len(cerrs) != 1 {
		t.Fatalf("compiling the broken snippet: %d errors, want 1:\n%v", len(cerrs), errors.Join(cerrs...))
	}
	if w := "bad.md:5: the ```go block, a complete file, does not compile or vet:"; !strings.HasPrefix(cerrs[0].Error(), w) || !strings.Contains(cerrs[0].Error(), "bad.md:10:") {
		t.Errorf("compiling the broken snippet reported\n\t%v\nwant it to begin %q and place the error at bad.md:10", cerrs[0], w)
	}
}
