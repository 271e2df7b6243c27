package profile

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/bad-*.errors from the current output")

// TestBadFiles parses every testdata/bad-*.json and compares the error, one line per
// joined error, with the paired bad-*.errors file.
func TestBadFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/bad-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 12 {
		t.Fatalf("found %d bad files, want at least 12", len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			c, _, err := Load(file)
			if err == nil {
				t.Fatalf("Load succeeded, want errors")
			}
			if c != nil {
				t.Errorf("Load returned a config with its error")
			}
			got := err.Error() + "\n"
			golden := strings.TrimSuffix(file, ".json") + ".errors"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("errors differ\ngot:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestErrorsAreSeparate checks that each problem is its own joined error.
func TestErrorsAreSeparate(t *testing.T) {
	data, err := os.ReadFile("testdata/bad-many.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse(data)
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %T is not a joined error", err)
	}
	errs := joined.Unwrap()
	if lines := strings.Split(err.Error(), "\n"); len(errs) != len(lines) || len(errs) < 5 {
		t.Fatalf("%d joined errors, %d lines; want equal and at least 5", len(errs), len(lines))
	}
	for _, e := range errs {
		if s := e.Error(); strings.Contains(s, "\n") || s != strings.ToLower(s[:1])+s[1:] {
			t.Errorf("error %q: want one lowercase line", s)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.json")
	_, data, err := Load(path)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load: %v, want fs.ErrNotExist", err)
	}
	if want := `reading profiles "` + path + `": `; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Load: %q, want prefix %q", err, want)
	}
	if data != nil {
		t.Errorf("Load returned data %q", data)
	}
}

func TestLoadReturnsBytesOnParseError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, data, err := Load(path)
	if err == nil || string(data) != "{" {
		t.Fatalf("Load = %q, %v; want the bytes and an error", data, err)
	}
}

func TestSyntaxErrorPosition(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", "syntax error at line 1, column 1: unexpected end of JSON input"},
		{"{\n", "syntax error at line 2, column 1: unexpected end of JSON input"},
		{"x", "syntax error at line 1, column 1: invalid character 'x' looking for beginning of value"},
		{"{}\n\n  }", "syntax error at line 3, column 3: invalid character '}' after top-level value"},
		{"{\n\t\"a\": tru }", `syntax error at line 2, column 10: invalid character ' ' in literal true (expecting 'e')`},
	} {
		_, err := Parse([]byte(tt.in))
		if err == nil || err.Error() != tt.want {
			t.Errorf("Parse(%q) = %v, want %s", tt.in, err, tt.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"args", "args", 0}, {"", "args", 4}, {"argz", "args", 1},
		{"alaises", "aliases", 1}, {"maxQueu", "maxQueue", 1}, {"mode", "name", 3},
		{"ab", "ba", 1}, {"abc", "ca", 3},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := editDistance(c.b, c.a); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.b, c.a, got, c.want)
		}
	}
}
