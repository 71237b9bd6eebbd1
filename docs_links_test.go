package kernrpc_test

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Every relative link in the repository's Markdown must lead somewhere: a
// file or directory that exists and, with a #fragment, a heading of that
// file. Results files, READMEs and docs point at each other by name, and a
// file renamed or a heading reworded leaves a reader at a dead end that no
// compiler sees.

// mdLink matches an inline link or image, [text](target) or
// [text](target "title"), and a reference definition, [label]: target.
var mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)|^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)`)

// link is one relative link of a Markdown file.
type link struct {
	file   string // the Markdown file, slash-separated from the repository root
	line   int
	target string
}

// relativeLinks lists the links of md that are neither absolute URLs nor
// inside code.
func relativeLinks(file string, md []byte) []link {
	var links []link
	for i, l := range strings.Split(withoutCode(string(md)), "\n") {
		for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
			target := m[1] + m[2]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, link{file: file, line: i + 1, target: target})
		}
	}
	return links
}

// codeSpan is inline code, which may run over a line break.
var codeSpan = regexp.MustCompile("`[^`]+`")

// withoutCode blanks out fenced code blocks and code spans, where brackets
// are not links, keeping every line where it was. Indented lines stay:
// here they continue list items, and code is fenced.
func withoutCode(md string) string {
	lines := strings.Split(md, "\n")
	fenced := false
	for i, l := range lines {
		t := strings.TrimSpace(l)
		fence := strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")
		if fence || fenced {
			lines[i] = ""
		}
		if fence {
			fenced = !fenced
		}
	}
	return codeSpan.ReplaceAllStringFunc(strings.Join(lines, "\n"), func(span string) string {
		return strings.Map(func(r rune) rune {
			if r == '\n' {
				return r
			}
			return ' '
		}, span)
	})
}

// headingAnchors is the set of fragments GitHub gives the headings of md.
func headingAnchors(md []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(string(md), "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimLeft(l, "#")
		if text == "" || text[0] != ' ' {
			continue
		}
		slug := anchorOf(text)
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// anchorOf is GitHub's fragment for a heading: its text lowercased,
// links reduced to their text, punctuation other than '-' and '_'
// dropped, and spaces made '-'.
func anchorOf(heading string) string {
	text := inlineLink.ReplaceAllString(strings.TrimSpace(heading), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinksResolve follows every relative link in the repository's
// Markdown. Benchmark results files are not read (markdownFiles leaves
// them out; they link nowhere), but links to them are followed.
func TestDocLinksResolve(t *testing.T) {
	root, files := repoMarkdown(t)
	checked := 0
	for _, file := range files {
		md, err := os.ReadFile(root + "/" + file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range relativeLinks(file, md) {
			checked++
			if msg := resolve(root, l); msg != "" {
				t.Errorf("%s:%d: link %q %s", l.file, l.line, l.target, msg)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("followed %d relative links in %d Markdown files; the repository has far more: is the link pattern broken?", checked, len(files))
	}
}

// resolve says what is wrong with l, or "" if it leads somewhere.
func resolve(root string, l link) string {
	target, fragment, _ := strings.Cut(l.target, "#")
	file := l.file
	if target != "" {
		file = path.Clean(path.Join(path.Dir(l.file), target))
		if strings.HasPrefix(file, "../") {
			return "leaves the repository"
		}
		info, err := os.Stat(root + "/" + file)
		if err != nil {
			return "leads to " + file + ", which does not exist"
		}
		if info.IsDir() {
			if fragment != "" {
				return "names a heading of a directory"
			}
			return ""
		}
	}
	if fragment == "" || !strings.HasSuffix(file, ".md") {
		return ""
	}
	md, err := os.ReadFile(root + "/" + file)
	if err != nil {
		return err.Error()
	}
	if !headingAnchors(md)[fragment] {
		return "names #" + fragment + ", which no heading of " + file + " has"
	}
	return ""
}

// TestDocLinkCheckerCatchesBadLinks shows that the checker finds what it
// is for, and passes over what is not a link.
func TestDocLinkCheckerCatchesBadLinks(t *testing.T) {
	md := []byte("# Top\n\n## A heading, with `code` and [a link](x.md)\n\n" +
		"[ok](docs_links_test.go) [dir](docs) [here](#top) [there](#a-heading-with-code-and-a-link)\n" +
		"[gone](no/such.md) [bad](#nowhere) ![img](missing.png)\n" +
		"`[not a link](nowhere.md)` [web](https://example.com/x) `a span\n[running on](nowhere.md)` \n" +
		"```\n[in code](nowhere.md)\n```\n" +
		"[ref]: also/missing.md\n")
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/bad.md", md, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"docs_links_test.go"} {
		if err := os.WriteFile(dir+"/"+name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(dir+"/docs", 0o755); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range relativeLinks("bad.md", md) {
		if msg := resolve(dir, l); msg != "" {
			got = append(got, fmt.Sprintf("%d %s", l.line, l.target))
		}
	}
	want := []string{"3 x.md", "6 no/such.md", "6 #nowhere", "6 missing.png", "12 also/missing.md"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("bad links found: %q\nwant %q", got, want)
	}
}
