// Package cli is the command line that poold and fleetd share: subcommands
// with their help and version, the parsing of each command's flags, the
// daemons' settings from flags, the environment and a YAML file
// (settings.go), and the status command (status.go).
//
// Both binaries exit 0 on success (help and version included), 1 when the
// command fails, and 2 on a usage error: an unknown command or flag, a bad
// argument, or a setting that does not parse.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"runtime/debug"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/pflag"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// A Command is one subcommand.
type Command struct {
	Name string
	// Args is what follows the name in the usage line, such as "[flags] FILE".
	Args string
	// Summary is one line on what the command does.
	Summary string
	// Run runs the command with the words after its name and returns the
	// exit code; "--help" among them prints the command's own usage.
	Run func(args []string) int
	// Hidden leaves the command out of the help: one that poold runs
	// itself, not an operator.
	Hidden bool
}

// A Program is a binary made of subcommands. Besides its Commands it answers
// "help [COMMAND]", "-h", "--help", "version" and "--version".
type Program struct {
	Name    string // the binary's name, "poold"
	Summary string // what the binary is, one sentence
	Version string // the version line, as "version" prints it
	// Commands are the subcommands, in the order the help lists them. The
	// first is the default: it runs when the arguments are empty or begin
	// with a flag.
	Commands []Command
	// More, when set, writes what the help shows after the commands (the
	// default command's flags).
	More func(w io.Writer)
}

// Main runs the command that args (the words after the binary's name) name
// and returns the exit code.
func (p *Program) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isFlag(args[0]) && !isHelp(args[0]) && args[0] != "--version" {
		return p.Commands[0].Run(args)
	}
	name, rest := args[0], args[1:]
	switch {
	case isHelp(name) || name == "help":
		if name == "help" && len(rest) > 0 {
			if c := p.command(rest[0]); c != nil {
				return c.Run([]string{"--help"})
			}
			if rest[0] == "version" {
				return p.version(stdout, stderr, []string{"--help"})
			}
			return p.unknown(stderr, rest[0])
		}
		p.help(stdout)
		return ExitOK
	case name == "version" || name == "--version":
		return p.version(stdout, stderr, rest)
	}
	if c := p.command(name); c != nil {
		return c.Run(rest)
	}
	return p.unknown(stderr, name)
}

func (p *Program) command(name string) *Command {
	for i := range p.Commands {
		if p.Commands[i].Name == name {
			return &p.Commands[i]
		}
	}
	return nil
}

func (p *Program) unknown(stderr io.Writer, name string) int {
	fmt.Fprintf(stderr, "%s: unknown command %q\nRun '%s help' for usage.\n", p.Name, name, p.Name)
	return ExitUsage
}

func (p *Program) version(stdout, stderr io.Writer, args []string) int {
	fl := NewFlagSet(p.Name + " version")
	if code, ok := ParseFlags(fl, "", args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() > 0 {
		return UsageError(stderr, fl, "", fmt.Errorf("unexpected arguments %q", fl.Args()))
	}
	fmt.Fprintln(stdout, p.Version)
	return ExitOK
}

// help writes the summary, one line per command and then More.
func (p *Program) help(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n", p.Summary)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	line := func(args, summary string) { fmt.Fprintf(tw, "  %s %s\t%s\n", p.Name, args, summary) }
	for i, c := range p.Commands {
		if c.Hidden {
			continue
		}
		args := c.Name + " " + c.Args
		if i == 0 {
			args = "[" + c.Name + "] " + c.Args
		}
		line(args, c.Summary)
	}
	line("version", "print the version")
	line("help [COMMAND]", "print this help, or a command's")
	tw.Flush()
	if p.More != nil {
		fmt.Fprintln(w)
		p.More(w)
	}
}

// UntilSignal adapts a daemon's serve function to Command.Run: its context
// ends at the first SIGTERM or SIGINT.
func UntilSignal(serve func(ctx context.Context, args []string) int) func(args []string) int {
	return func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return serve(ctx, args)
	}
}

// NewFlagSet returns an empty flag set for the command as typed ("poold
// status"), to be parsed with ParseFlags.
func NewFlagSet(command string) *pflag.FlagSet {
	fl := pflag.NewFlagSet(command, pflag.ContinueOnError)
	fl.SetOutput(io.Discard)
	fl.Usage = func() {}
	fl.SortFlags = false
	return fl
}

// ParseFlags parses a command's args into fl, a flag set from NewFlagSet.
// usage is what follows the command in its usage line ("[flags] FILE"). On
// -h or --help it prints the usage and fl's flags to stdout and returns
// ExitOK and false; on a bad flag it prints the error and the usage line to
// stderr and returns ExitUsage and false. It returns true when the command
// should go on.
func ParseFlags(fl *pflag.FlagSet, usage string, args []string, stdout, stderr io.Writer) (int, bool) {
	err := fl.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		PrintUsage(stdout, fl, usage)
		return ExitOK, false
	case err != nil:
		return UsageError(stderr, fl, usage, err), false
	}
	return ExitOK, true
}

// PrintUsage writes fl's usage line and its flags, if it has any.
func PrintUsage(w io.Writer, fl *pflag.FlagSet, usage string) {
	fmt.Fprintf(w, "usage: %s\n", usageLine(fl, usage))
	if fl.HasFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", fl.FlagUsages())
	}
}

// UsageError prints "COMMAND: err" and the usage line to stderr and returns
// ExitUsage.
func UsageError(stderr io.Writer, fl *pflag.FlagSet, usage string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\nusage: %s (--help for more)\n", fl.Name(), err, usageLine(fl, usage))
	return ExitUsage
}

func usageLine(fl *pflag.FlagSet, usage string) string {
	if usage == "" {
		return fl.Name()
	}
	return fl.Name() + " " + usage
}

func isFlag(s string) bool { return len(s) > 0 && s[0] == '-' }

func isHelp(s string) bool { return s == "-h" || s == "--help" }

// Revision is the commit a binary was built from: stamped, when the build
// set it (the Makefile stamps it with -ldflags), else the VCS revision Go
// recorded, else "unknown" (a build without VCS stamping and without the
// Makefile's, such as go run or go test).
func Revision(stamped string) string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
