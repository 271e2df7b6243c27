// Package docs checks the repository's Markdown as a reader meets it: every
// relative link reaches a file (and its anchor a heading there), every
// table renders (a header, its separator, and rows of the header's width),
// and no text leans on anything outside the repository: no issue numbers,
// no paths above its root.
package docs

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// root is the repository, from this package's folder.
const root = "../.."

// markdown lists the Markdown files the repository tracks.
func markdown(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, f := range tracked(t) {
		if strings.HasSuffix(f, ".md") {
			files = append(files, f)
		}
	}
	if len(files) < 3 {
		t.Fatalf("found only %v: the README and docs/ should be here", files)
	}
	return files
}

// tracked lists every file git tracks, relative to root.
func tracked(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	var files []string
	for _, f := range bytes.Split(out, []byte{0}) {
		if len(f) > 0 {
			files = append(files, string(f))
		}
	}
	return files
}

// prose returns the lines of a Markdown file outside fenced code blocks,
// each with its number (from 1); the lines inside are "".
func prose(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines = append(lines, "")
			continue
		}
		if fenced {
			lines = append(lines, "")
			continue
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return lines
}

var (
	link    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*$`)
	code    = regexp.MustCompile("`[^`]*`")
)

// slug is the anchor GitHub gives a heading: lowercased, its punctuation
// left out but for hyphens and underscores, each space a hyphen.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings, numbered as
// GitHub numbers repeats (name, name-1, …).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(t, path) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(strings.ReplaceAll(m[1], "`", ""))
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestLinksResolve: every relative link of the Markdown reaches a file or
// folder of the repository, and its anchor, if any, a heading of that file.
func TestLinksResolve(t *testing.T) {
	files := markdown(t)
	for _, f := range files {
		for i, line := range prose(t, f) {
			for _, m := range link.FindAllStringSubmatch(code.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				resolved := f
				if path != "" {
					resolved = filepath.Join(filepath.Dir(f), path)
					if rel, err := filepath.Rel(".", resolved); err != nil || strings.HasPrefix(rel, "..") {
						t.Errorf("%s:%d: link %q leaves the repository", f, i+1, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, resolved)); err != nil {
						t.Errorf("%s:%d: link %q: no such file", f, i+1, target)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(resolved, ".md") && !anchors(t, resolved)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading for #%s", f, i+1, target, resolved, anchor)
				}
			}
		}
	}
}

// cells counts the cells of a table row: its unescaped pipes, less the
// outer ones.
func cells(row string) int {
	row = strings.TrimSpace(row)
	n := 0
	for i := 0; i < len(row); i++ {
		switch row[i] {
		case '\\':
			i++
		case '|':
			n++
		}
	}
	if strings.HasPrefix(row, "|") {
		n--
	}
	if strings.HasSuffix(row, "|") && !strings.HasSuffix(row, `\|`) {
		n--
	}
	return n + 1
}

var separator = regexp.MustCompile(`^\|?(\s*:?-{3,}:?\s*\|)*\s*:?-{3,}:?\s*\|?$`)

// TestTablesRender: every block of lines that starts with a pipe is a table
// GitHub renders: a header, a separator of the same width, rows of that
// width, and nothing of the table cut off by a line of prose.
func TestTablesRender(t *testing.T) {
	for _, f := range markdown(t) {
		lines := prose(t, f)
		for i := 0; i < len(lines); i++ {
			if !strings.HasPrefix(strings.TrimSpace(lines[i]), "|") {
				continue
			}
			start, width := i, cells(lines[i])
			if i+1 >= len(lines) || !separator.MatchString(strings.TrimSpace(lines[i+1])) {
				t.Errorf("%s:%d: a table row without a header and separator above it (a table cut off, or a row outside it)", f, i+1)
			} else if w := cells(lines[i+1]); w != width {
				t.Errorf("%s:%d: the separator has %d cells, the header %d", f, i+2, w, width)
			}
			for i++; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
				if i == start+1 {
					continue
				}
				if w := cells(lines[i]); w != width {
					t.Errorf("%s:%d: a row of %d cells in a table of %d (an unescaped pipe?)", f, i+1, w, width)
				}
			}
		}
	}
}

var (
	issueRef  = regexp.MustCompile(`(?i)\bissues?\s+#?\d+|\bissue\s+"`)
	outerPath = regexp.MustCompile(`\.\./shared\b`)
)

// TestStandsAlone: the repository's text and code cite nothing outside it:
// no issue numbers of a tracker it does not hold, no files above its root.
func TestStandsAlone(t *testing.T) {
	self := filepath.Join("test", "docs", "docs_test.go")
	for _, f := range tracked(t) {
		if f == self {
			continue
		}
		switch filepath.Ext(f) {
		case ".go", ".md", ".sh", ".py", ".yml", ".yaml", ".service", ".json", ".txt", "":
		default:
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil || bytes.IndexByte(data, 0) >= 0 {
			continue // a link, or binary
		}
		for i, line := range strings.Split(string(data), "\n") {
			if m := issueRef.FindString(line); m != "" {
				t.Errorf("%s:%d: %q cites an issue tracker the repository does not hold", f, i+1, m)
			}
			if outerPath.MatchString(line) {
				t.Errorf("%s:%d: cites a file outside the repository", f, i+1)
			}
		}
	}
}

// The checks' own parts, on the cases they must tell apart.
func TestCheckerParts(t *testing.T) {
	for h, want := range map[string]string{
		"503 `queue_full`, `queue_timeout`, `engine_backoff`": "503-queue_full-queue_timeout-engine_backoff",
		"A restart loaded a pool afresh: `is not adopted`":    "a-restart-loaded-a-pool-afresh-is-not-adopted",
		"What poold reads": "what-poold-reads",
	} {
		if got := slug(strings.ReplaceAll(h, "`", "")); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	for row, want := range map[string]int{
		"| a | b |": 2, "a | b": 2, "| a \\| b | c |": 2, "|---|---|---|": 3, "| `x` |": 1,
	} {
		if got := cells(row); got != want {
			t.Errorf("cells(%q) = %d, want %d", row, got, want)
		}
	}
	for _, s := range []string{"|---|---|", "| :--- | ---: |", "---|---"} {
		if !separator.MatchString(s) {
			t.Errorf("%q is a separator", s)
		}
	}
	if separator.MatchString("| a | b |") {
		t.Error("a row taken for a separator")
	}
	for line, want := range map[string]bool{"the target (issue 6) is": true, "issues 13–22": true, "an issue with it": false, "reissue 4": false} {
		if got := issueRef.MatchString(line); got != want {
			t.Errorf("issueRef on %q: %t, want %t", line, got, want)
		}
	}
}

// codeName is a Go file or a package folder named in code spans:
// `loop.go`, `internal/pool/sockets.go`, `cmd/poold/shim.go`, `internal/engine`.
var codeName = regexp.MustCompile("`((?:internal|cmd|test)/[a-z0-9_/]+(?:\\.go)?|[a-z][a-z0-9_]*\\.go)`")

// Every Go file and package the architecture names is in the tree: a file
// moved or renamed takes its description with it.
func TestArchitectureNamesExist(t *testing.T) {
	files := tracked(t)
	bases := map[string]bool{}
	paths := map[string]bool{}
	for _, f := range files {
		bases[filepath.Base(f)] = true
		for d := f; d != "."; d = filepath.Dir(d) {
			paths[d] = true
		}
	}
	named := 0
	for i, line := range prose(t, "docs/architecture.md") {
		for _, m := range codeName.FindAllStringSubmatch(line, -1) {
			name := m[1]
			named++
			if strings.Contains(name, "/") && !paths[name] || !strings.Contains(name, "/") && !bases[name] {
				t.Errorf("docs/architecture.md:%d: `%s` is not in the tree", i+1, name)
			}
		}
	}
	if named < 20 {
		t.Fatalf("only %d Go files and packages named in docs/architecture.md: the pattern no longer finds them", named)
	}
}
