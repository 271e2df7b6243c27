package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/pflag"

	"github.com/poold/poold/internal/cli"
	"github.com/poold/poold/internal/profile"
	"github.com/poold/poold/internal/tenant"
)

// check validates a profiles file, a tenants file (--tenants) or both: exit
// 0 valid, 1 invalid, 2 unreadable (the worst of the two). An invalid file
// is reported as "FILE: invalid:" on stderr, then every problem on a line
// of its own, each naming its JSON path. A valid file is "FILE: ok" on
// stdout, and for a profiles file what would fail on host, its engines
// started by self and the vllm-command setting (removed vLLM flags, missing
// engine binaries and model paths), is "FILE: warnings:" on stderr, then a
// line per warning: warnings alone still exit 0. vllm-command is read as
// serve reads it (checkLauncher); a settings file that serve could not read
// exits 2.
func check(args []string, host profile.Host, self string, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("poold check")
	tenants := fl.String("tenants", "", "a tenants file to validate (docs/tenancy.md)")
	fl.String("config", "", "the settings file that vllm-command is read from, as serve reads it; default "+defaultSettingsFile+" when it exists")
	fl.String(vllmCommandSetting, profile.DefaultVLLMCommand, "the "+vllmCommandSetting+" that serve runs with, whose engine binary is checked; else from POOLD_VLLM_COMMAND or the settings file, as serve reads it")
	const usage = "[PROFILES] [--tenants FILE] [--vllm-command CMD] [--config FILE]"
	if code, ok := cli.ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	if fl.NArg() > 1 || fl.NArg() == 0 && *tenants == "" {
		return cli.UsageError(stderr, fl, usage, errors.New("a profiles file, a tenants file (--tenants) or both are required"))
	}
	code := 0
	if fl.NArg() == 1 {
		launch := profile.Launch{Self: self}
		var err error
		if launch.VLLM, err = checkLauncher(fl); err != nil {
			fmt.Fprintf(stderr, "poold check: %v\n", err)
			return 2
		}
		file := fl.Arg(0)
		c, _, err := profile.Load(file)
		code = report(file, err, stdout, stderr)
		if err == nil {
			if warnings := c.Warnings(host, launch); len(warnings) > 0 {
				fmt.Fprintf(stderr, "%s: warnings:\n%v\n", file, errors.Join(warnings...))
			}
		}
	}
	if *tenants != "" {
		_, _, err := tenant.Load(*tenants)
		code = max(code, report(*tenants, err, stdout, stderr))
	}
	return code
}

// checkLauncher is the vllm-command setting split into words, from check's
// flags (fl's --vllm-command and --config), else from the environment and
// the settings file as serve reads them (serveSources).
func checkLauncher(fl *pflag.FlagSet) ([]string, error) {
	var args []string
	for _, name := range []string{"config", vllmCommandSetting} {
		if f := fl.Lookup(name); f.Changed {
			args = append(args, "--"+name+"="+f.Value.String())
		}
	}
	v, err := cli.LoadSettings(serveFlags(), args, serveSources)
	if err != nil {
		return nil, err
	}
	launcher := strings.Fields(v.String(vllmCommandSetting))
	if len(launcher) == 0 {
		return nil, errVLLMCommandEmpty
	}
	return launcher, nil
}

// report prints the outcome of loading file and returns its exit code.
func report(file string, err error, stdout, stderr io.Writer) int {
	if pathErr := (*fs.PathError)(nil); errors.As(err, &pathErr) {
		fmt.Fprintf(stderr, "poold check: %v\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: invalid:\n%v\n", file, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", file)
	return 0
}

// hashKey prints what a tenants file holds for each API key: the key given
// as the argument, or each line of stdin (so that the key shows neither in
// ps nor in the shell's history).
func hashKey(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := cli.NewFlagSet("poold hash-key")
	const usage = "[KEY]  (without KEY, one key per line of stdin)"
	if code, ok := cli.ParseFlags(fl, usage, args, stdout, stderr); !ok {
		return code
	}
	switch fl.NArg() {
	case 0:
		sc := bufio.NewScanner(stdin)
		n := 0
		for sc.Scan() {
			if key := strings.TrimSpace(sc.Text()); key != "" {
				fmt.Fprintln(stdout, tenant.HashKey(key))
				n++
			}
		}
		if err := sc.Err(); err != nil {
			fmt.Fprintf(stderr, "poold hash-key: reading stdin: %v\n", err)
			return 1
		}
		if n == 0 {
			return cli.UsageError(stderr, fl, usage, errors.New("no key on stdin"))
		}
	case 1:
		fmt.Fprintln(stdout, tenant.HashKey(fl.Arg(0)))
	default:
		return cli.UsageError(stderr, fl, usage, errors.New("one key at most"))
	}
	return 0
}

// localHost is this machine, for check's warnings and the pools' checks
// before a cold start.
func localHost() profile.Host {
	return profile.Host{LookPath: exec.LookPath, Stat: os.Stat}
}
