package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// testProgram has a default command "run", which records its arguments, and
// "show", which takes one flag.
func testProgram(ran *[]string) *Program {
	cmd := func(name string) func([]string) int {
		return func(args []string) int {
			*ran = append([]string{name}, args...)
			return 7
		}
	}
	return &Program{
		Name:    "prog",
		Summary: "prog does things.",
		Version: "prog v1.2.3 (abc)",
		Commands: []Command{
			{Name: "run", Args: "[flags]", Summary: "run it (the default)", Run: cmd("run")},
			{Name: "show", Args: "[--all] NAME", Summary: "show one thing", Run: cmd("show")},
		},
		More: func(w io.Writer) { fmt.Fprintln(w, "Flags of run: --fast") },
	}
}

func TestProgramHelp(t *testing.T) {
	const want = `prog does things.

Usage:
  prog [run] [flags]       run it (the default)
  prog show [--all] NAME   show one thing
  prog version             print the version
  prog help [COMMAND]      print this help, or a command's

Flags of run: --fast
`
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var ran []string
		var stdout, stderr bytes.Buffer
		if code := testProgram(&ran).Main(args, &stdout, &stderr); code != ExitOK {
			t.Errorf("%q: exit %d, want 0", args, code)
		}
		if stdout.String() != want || stderr.Len() != 0 || ran != nil {
			t.Errorf("%q: stdout:\n%s\nstderr %q, ran %q; want:\n%s", args, stdout.String(), stderr.String(), ran, want)
		}
	}
}

func TestProgramDispatch(t *testing.T) {
	for _, tt := range []struct {
		args           []string
		code           int
		ran            []string // the command run and its arguments
		stdout, stderr string
	}{
		{args: nil, code: 7, ran: []string{"run"}},
		{args: []string{"--fast", "x"}, code: 7, ran: []string{"run", "--fast", "x"}},
		{args: []string{"run", "--fast"}, code: 7, ran: []string{"run", "--fast"}},
		{args: []string{"show", "--help"}, code: 7, ran: []string{"show", "--help"}},
		{args: []string{"help", "show"}, code: 7, ran: []string{"show", "--help"}},
		{args: []string{"version"}, code: 0, stdout: "prog v1.2.3 (abc)\n"},
		{args: []string{"--version"}, code: 0, stdout: "prog v1.2.3 (abc)\n"},
		{args: []string{"version", "--help"}, code: 0, stdout: "usage: prog version\n"},
		{args: []string{"help", "version"}, code: 0, stdout: "usage: prog version\n"},
		{args: []string{"version", "extra"}, code: 2, stderr: "prog version: unexpected arguments [\"extra\"]\nusage: prog version (--help for more)\n"},
		{args: []string{"--version", "--short"}, code: 2, stderr: "prog version: unknown flag: --short\nusage: prog version (--help for more)\n"},
		{args: []string{"nope"}, code: 2, stderr: "prog: unknown command \"nope\"\nRun 'prog help' for usage.\n"},
		{args: []string{"help", "nope"}, code: 2, stderr: "prog: unknown command \"nope\"\nRun 'prog help' for usage.\n"},
	} {
		var ran []string
		var stdout, stderr bytes.Buffer
		code := testProgram(&ran).Main(tt.args, &stdout, &stderr)
		if code != tt.code || strings.Join(ran, " ") != strings.Join(tt.ran, " ") || stdout.String() != tt.stdout || stderr.String() != tt.stderr {
			t.Errorf("%q: exit %d, ran %q, stdout %q, stderr %q\nwant exit %d, ran %q, stdout %q, stderr %q",
				tt.args, code, ran, stdout.String(), stderr.String(), tt.code, tt.ran, tt.stdout, tt.stderr)
		}
	}
}

func TestParseFlags(t *testing.T) {
	parse := func(args ...string) (code int, ok bool, all bool, stdout, stderr string) {
		fl := NewFlagSet("prog show")
		a := fl.Bool("all", false, "show everything")
		var out, errOut bytes.Buffer
		code, ok = ParseFlags(fl, "[--all] NAME", args, &out, &errOut)
		return code, ok, *a, out.String(), errOut.String()
	}
	if code, ok, all, stdout, stderr := parse("--all", "x"); code != ExitOK || !ok || !all || stdout != "" || stderr != "" {
		t.Errorf("--all x: %d %v %v %q %q", code, ok, all, stdout, stderr)
	}
	code, ok, _, stdout, stderr := parse("x", "--help")
	if code != ExitOK || ok || stderr != "" ||
		!strings.HasPrefix(stdout, "usage: prog show [--all] NAME\n\nFlags:\n") || !strings.Contains(stdout, "--all") {
		t.Errorf("--help: %d %v, stdout %q, stderr %q", code, ok, stdout, stderr)
	}
	code, ok, _, stdout, stderr = parse("--some")
	if code != ExitUsage || ok || stdout != "" || stderr != "prog show: unknown flag: --some\nusage: prog show [--all] NAME (--help for more)\n" {
		t.Errorf("--some: %d %v, stdout %q, stderr %q", code, ok, stdout, stderr)
	}
}

func TestRevision(t *testing.T) {
	if got := Revision("0123abc"); got != "0123abc" {
		t.Errorf("Revision(stamped) = %q, want the stamp", got)
	}
	// A test binary carries no VCS stamp.
	if got := Revision(""); got != "unknown" {
		t.Errorf("Revision(\"\") = %q in a test binary, want unknown", got)
	}
}
