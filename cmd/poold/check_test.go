package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckBadFiles runs `poold check` on every golden bad profiles file: exit
// 1, nothing on stdout, and on stderr a header line followed by exactly the
// lines of the paired .errors file.
func TestCheckBadFiles(t *testing.T) {
	files, err := filepath.Glob("../../internal/profile/testdata/bad-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 12 {
		t.Fatalf("found %d bad files, want at least 12", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(file, ".json") + ".errors")
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			if code := check([]string{file}, &stdout, &stderr); code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q, want nothing", stdout.String())
			}
			if got := stderr.String(); got != file+": invalid:\n"+string(want) {
				t.Errorf("stderr:\n%s\nwant %q then:\n%s", got, file+": invalid:", want)
			}
		})
	}
}

func TestCheckGoodAndUnreadable(t *testing.T) {
	good := "../../internal/profile/testdata/good-design.json"
	missing := filepath.Join(t.TempDir(), "nope.json")
	for _, tt := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{good}, 0, good + ": ok\n", ""},
		{[]string{missing}, 2, "", `poold check: reading profiles "` + missing + `": open ` + missing + ": no such file or directory\n"},
		{[]string{t.TempDir()}, 2, "", ""}, // a directory: unreadable
		{nil, 2, "", "poold check: one profiles file is required\nusage: poold check FILE (--help for more)\n"},
		{[]string{good, good}, 2, "", "poold check: one profiles file is required\nusage: poold check FILE (--help for more)\n"},
		{[]string{"--help"}, 0, "usage: poold check FILE\n", ""},
		{[]string{"-h", good}, 0, "usage: poold check FILE\n", ""},
		{[]string{"--strict", good}, 2, "", "poold check: unknown flag: --strict\nusage: poold check FILE (--help for more)\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := check(tt.args, &stdout, &stderr)
		if code != tt.code || stdout.String() != tt.stdout || (tt.stderr != "" && stderr.String() != tt.stderr) {
			t.Errorf("check(%q) = %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
		}
	}
}
