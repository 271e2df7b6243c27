#!/usr/bin/env python3
"""Runs a command under a seccomp filter that stands in for systemd's:

  --allow FILE     SystemCallFilter= as an allow list: the syscall numbers in
                   FILE (one a line; a first line "max N" makes every number
                   above N answer ENOSYS, as systemd does for syscalls newer
                   than its table); anything else gets EPERM, as with
                   SystemCallErrorNumber=EPERM
  --families L     RestrictAddressFamilies=: socket() of a family not in the
                   comma-separated list L gets EAFNOSUPPORT
  --mdwe           MemoryDenyWriteExecute=: writable and executable mmap(),
                   and mprotect()/pkey_mprotect() adding PROT_EXEC, get EPERM

It always applies SystemCallArchitectures=native (x86-64 only). Usage:

  seccomp_run.py [--allow FILE] [--families 1,2,10,16] [--mdwe] -- CMD ARGS...
"""
import ctypes
import errno
import os
import struct
import sys

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SYSCALL = {"shmat": 30, "mmap": 9, "mprotect": 10, "socket": 41, "pkey_mprotect": 329}
PROT_WRITE, PROT_EXEC, SHM_EXEC = 2, 4, 0o100000

# Classic BPF opcodes and seccomp return values.
LD_ABS, JEQ, JGT, JGE, JSET, AND, RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x54, 0x06
ALLOW = 0x7FFF0000
# Offsets in struct seccomp_data: nr, arch, then args[] of 8 bytes each.
NR, ARCH, ARG0, ARG2 = 0, 4, 16, 32


def ins(code, k=0, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)


def fail(e):
    return ins(RET, 0x00050000 | e)


def build(allow, max_known, families, mdwe):
    """The filter program. The argument checks come first and, when they pass,
    allow the call at once: the allow list must hold socket, mmap and mprotect
    (the ones that are not in it are skipped)."""
    p = [ins(LD_ABS, ARCH), ins(JEQ, AUDIT_ARCH_X86_64, 1, 0), fail(errno.EPERM),
         ins(LD_ABS, NR), ins(JGE, X32_SYSCALL_BIT, 0, 1), fail(errno.EPERM)]
    checks = []
    if families is not None:
        body = [ins(LD_ABS, ARG0)]
        for f in families:
            body += [ins(JEQ, f, 0, 1), ins(RET, ALLOW)]
        checks.append(("socket", body + [fail(errno.EAFNOSUPPORT)]))
    if mdwe:
        checks.append(("mmap", [ins(LD_ABS, ARG2), ins(AND, PROT_WRITE | PROT_EXEC),
                                ins(JEQ, PROT_WRITE | PROT_EXEC, 0, 1), fail(errno.EPERM), ins(RET, ALLOW)]))
        for name in ("mprotect", "pkey_mprotect"):
            checks.append((name, [ins(LD_ABS, ARG2), ins(JSET, PROT_EXEC, 0, 1), fail(errno.EPERM), ins(RET, ALLOW)]))
        checks.append(("shmat", [ins(LD_ABS, ARG2), ins(JSET, SHM_EXEC, 0, 1), fail(errno.EPERM), ins(RET, ALLOW)]))
    for name, body in checks:
        if allow is not None and SYSCALL[name] not in allow:
            continue
        p += [ins(JEQ, SYSCALL[name], 0, len(body))] + body
    if allow is None:
        return b"".join(p + [ins(RET, ALLOW)])
    if max_known:
        p += [ins(JGT, max_known, 0, 1), fail(errno.ENOSYS)]
    for nr in sorted(allow):
        p += [ins(JEQ, nr, 0, 1), ins(RET, ALLOW)]
    return b"".join(p + [fail(errno.EPERM)])


def main(args):
    allow, max_known, families, mdwe = None, 0, None, False
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag == "--allow":
            lines = [line.split() for line in open(args.pop(0)) if line.strip()]
            if lines and lines[0][0] == "max":
                max_known = int(lines.pop(0)[1])
            allow = {int(line[0]) for line in lines}
        elif flag == "--families":
            families = [int(f) for f in args.pop(0).split(",")]
        elif flag == "--mdwe":
            mdwe = True
        else:
            sys.exit(f"seccomp_run.py: unknown flag {flag}")
    if not args or len(args) < 2:
        sys.exit(__doc__)
    cmd = args[1:]

    prog = ctypes.create_string_buffer(build(allow, max_known, families, mdwe))
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog.raw) // 8, ctypes.addressof(prog)))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
