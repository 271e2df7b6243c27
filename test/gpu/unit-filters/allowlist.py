#!/usr/bin/env python3
"""Prints, for seccomp_run.py --allow, the x86-64 syscall numbers that a
unit's SystemCallFilter= lines allow, less any groups or names given after the
unit (for example ~@privileged). Needs systemd-analyze (to expand the groups)
and the kernel's asm/unistd_64.h (Debian: linux-libc-dev). Usage:

  allowlist.py systemd/poold.service [~@group|~name ...] > allow.txt
"""
import re
import subprocess
import sys

HEADER = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"


def expand(item, seen=None):
    """The syscall names of a group (recursively) or a name."""
    if not item.startswith("@"):
        return {item}
    seen = set() if seen is None else seen
    if item in seen:
        return set()
    seen.add(item)
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager", item],
                         check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if word and not word.startswith("#"):
            names |= expand(word, seen)
    return names


def main(unit, extra):
    numbers = {}
    with open(HEADER) as f:
        for line in f:
            m = re.match(r"#define __NR_(\w+) (\d+)", line)
            if m:
                numbers[m.group(1)] = int(m.group(2))
    with open(unit) as f:
        lines = [line.split("=", 1)[1].strip() for line in f if line.startswith("SystemCallFilter=")]
    allowed = set()
    # As in systemd, a leading ~ makes the whole line a deny list.
    for line in lines + [" ".join(extra)]:
        deny = line.startswith("~")
        for item in line.lstrip("~").split():
            names = expand(item.lstrip("~"))
            allowed = allowed - names if deny or item.startswith("~") else allowed | names
    print("max", max(numbers.values()))
    for name in sorted(allowed):
        if name in numbers:
            print(numbers[name], name)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
