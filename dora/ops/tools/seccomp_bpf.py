"""Seccomp filters for the python sandbox, written as classic BPF with the standard library (struct).

Two programs, both deny-lists over an allowed default (as flatpak's; an allow-list of everything
CPython and its extension modules call would break on every new libc):
- `base_filter()`: loaded by bubblewrap (`--seccomp FD`) before the interpreter starts. Refuses the
  kernel interfaces a program has no business with: tracing other processes (ptrace,
  process_vm_*), namespaces and mounts (unshare, setns, mount and the new mount API, clone with
  CLONE_NEWUSER), keyrings, bpf, perf_event_open, userfaultfd, io_uring (its own syscall surface),
  kernel modules, kexec, reboot, swap, clocks, quotas, dmesg, file handles (open_by_handle_at
  escapes a bind mount), TIOCSTI/TIOCLINUX (typing into a terminal), every socket family but
  AF_UNIX, and personality flags (ADDR_NO_RANDOMIZE).
- `process_filter()`: installed by the sandboxed interpreter itself (prctl) once it has started,
  because it refuses execve, which bubblewrap needs to start it: no exec, no fork or vfork, clone
  only for threads (CLONE_THREAD), clone3 answered ENOSYS so libc falls back to clone.
A refused call returns EPERM (the new mount API and clone3: ENOSYS); a call from another
architecture's ABI (int 0x80 on x86_64) kills the process, and x32 calls are refused.

Syscall numbers come from the kernel's unistd headers (x86_64: asm/unistd_64.h; aarch64:
asm-generic/unistd.h); tests/test_tools_sandbox.py checks them against the headers where those are
installed. On other architectures there is no filter (`supported()` is False) and the sandbox
reports that it runs without one.
"""

from __future__ import annotations

import errno
import platform
import struct

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS, ALU_AND_K, JEQ_K, JGE_K, RET_K = 0x20, 0x54, 0x15, 0x35, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFF_NR, OFF_ARCH = 0, 4


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of syscall argument i in struct seccomp_data (little-endian)."""
    return 16 + 8 * i


CLONE_THREAD, CLONE_NEWUSER = 0x00010000, 0x10000000
AF_UNIX, TIOCSTI, TIOCLINUX = 1, 0x5412, 0x541C
PERSONALITY_QUERY, PER_LINUX = 0xFFFFFFFF, 0

# name -> number, only the calls the filters name
_COMMON_X86_64 = dict(
    ioctl=16, socket=41, clone=56, fork=57, vfork=58, execve=59, ptrace=101, syslog=103, uselib=134, personality=135,
    vhangup=153, modify_ldt=154, pivot_root=155, adjtimex=159, chroot=161, acct=163, settimeofday=164, mount=165,
    umount2=166, swapon=167, swapoff=168, reboot=169, sethostname=170, setdomainname=171, iopl=172, ioperm=173,
    init_module=175, delete_module=176, quotactl=179, nfsservctl=180, lookup_dcookie=212, clock_settime=227,
    mbind=237, set_mempolicy=238, get_mempolicy=239, kexec_load=246, add_key=248, request_key=249, keyctl=250,
    migrate_pages=256, unshare=272, move_pages=279, perf_event_open=298, fanotify_init=300, name_to_handle_at=303,
    open_by_handle_at=304, clock_adjtime=305, setns=308, process_vm_readv=310, process_vm_writev=311, kcmp=312,
    finit_module=313, kexec_file_load=320, bpf=321, execveat=322, userfaultfd=323)
_COMMON_AARCH64 = dict(
    lookup_dcookie=18, ioctl=29, umount2=39, mount=40, pivot_root=41, nfsservctl=42, chroot=51, vhangup=58,
    quotactl=60, acct=89, personality=92, unshare=97, kexec_load=104, init_module=105, delete_module=106,
    clock_settime=112, syslog=116, ptrace=117, reboot=142, sethostname=161, setdomainname=162, settimeofday=170,
    adjtimex=171, socket=198, add_key=217, request_key=218, keyctl=219, clone=220, execve=221, swapon=224,
    swapoff=225, mbind=235, get_mempolicy=236, set_mempolicy=237, migrate_pages=238, move_pages=239,
    perf_event_open=241, fanotify_init=262, name_to_handle_at=264, open_by_handle_at=265, clock_adjtime=266,
    setns=268, process_vm_readv=270, process_vm_writev=271, kcmp=272, finit_module=273, bpf=280, execveat=281,
    userfaultfd=282, kexec_file_load=294)
_UNIFIED = dict(io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428, move_mount=429,
                fsopen=430, fsconfig=431, fsmount=432, fspick=433, clone3=435, pidfd_getfd=438, mount_setattr=442,
                quotactl_fd=443)   # numbered alike on every architecture since Linux 5.1
ARCHES = {   # platform.machine() -> (AUDIT_ARCH_*, syscall numbers)
    "x86_64": (0xC000003E, {**_COMMON_X86_64, **_UNIFIED}),
    "aarch64": (0xC00000B7, {**_COMMON_AARCH64, **_UNIFIED}),
}
X32_BIT = 0x40000000   # x86_64: the x32 ABI's syscalls carry this bit

# (syscall, errno, condition); condition None = always, ("masked_eq", arg, mask, value), ("not_in", arg, values)
Rule = tuple
BASE_RULES: list[Rule] = [
    *[(name, errno.EPERM, None) for name in (
        "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "unshare", "setns", "mount",
        "umount2", "pivot_root", "chroot", "syslog", "acct", "quotactl", "quotactl_fd", "add_key", "keyctl",
        "request_key", "move_pages", "mbind", "get_mempolicy", "set_mempolicy", "migrate_pages", "perf_event_open",
        "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load",
        "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon", "swapoff", "reboot",
        "open_by_handle_at", "name_to_handle_at", "fanotify_init", "lookup_dcookie", "vhangup", "nfsservctl",
        "sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
        "uselib", "modify_ldt", "iopl", "ioperm")],
    *[(name, errno.ENOSYS, None) for name in ("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                                              "mount_setattr")],
    ("clone", errno.EPERM, ("masked_eq", 0, CLONE_NEWUSER, CLONE_NEWUSER)),
    ("ioctl", errno.EPERM, ("masked_eq", 1, 0xFFFFFFFF, TIOCSTI)),
    ("ioctl", errno.EPERM, ("masked_eq", 1, 0xFFFFFFFF, TIOCLINUX)),
    ("socket", errno.EPERM, ("not_in", 0, (AF_UNIX,))),
    ("personality", errno.EPERM, ("not_in", 0, (PER_LINUX, PERSONALITY_QUERY))),
]
PROCESS_RULES: list[Rule] = [
    ("execve", errno.EPERM, None), ("execveat", errno.EPERM, None), ("fork", errno.EPERM, None),
    ("vfork", errno.EPERM, None), ("clone3", errno.ENOSYS, None),
    ("clone", errno.EPERM, ("masked_eq", 0, CLONE_THREAD, 0)),   # a new process, not a thread
]


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in ARCHES


def base_filter(machine: str | None = None) -> bytes:
    return compile_rules(BASE_RULES, machine or platform.machine())


def process_filter(machine: str | None = None) -> bytes:
    return compile_rules(PROCESS_RULES, machine or platform.machine())


def compile_rules(rules: list[Rule], machine: str) -> bytes:
    """The rules as a BPF program (struct sock_filter[], native byte order); rules naming a call the
    architecture lacks (fork on aarch64) are left out."""
    audit_arch, numbers = ARCHES[machine]
    prog = [(LD_W_ABS, 0, 0, OFF_ARCH), (JEQ_K, 1, 0, audit_arch), (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_W_ABS, 0, 0, OFF_NR)]
    if machine == "x86_64":
        prog += [(JGE_K, 0, 1, X32_BIT), (RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
    for name, err, cond in rules:
        if name in numbers:
            block = _condition(cond) + [(RET_K, 0, 0, RET_ERRNO | err)] + ([] if cond is None else [(LD_W_ABS, 0, 0, OFF_NR)])
            prog += [(JEQ_K, 0, len(block), numbers[name])] + block
    prog.append((RET_K, 0, 0, RET_ALLOW))
    if len(prog) > 4096:   # BPF_MAXINSNS
        raise ValueError(f"seccomp program of {len(prog)} instructions is over the kernel's 4096")
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def _condition(cond) -> list[tuple[int, int, int, int]]:
    """Instructions that fall through to the refusal when `cond` holds and jump over it otherwise
    (to the reload of the syscall number that follows it)."""
    if cond is None:
        return []
    kind, arg = cond[0], cond[1]
    if kind == "masked_eq":
        _, _, mask, value = cond
        return [(LD_W_ABS, 0, 0, _arg_low(arg)), (ALU_AND_K, 0, 0, mask), (JEQ_K, 0, 1, value)]
    if kind == "not_in":
        values = cond[2]
        return [(LD_W_ABS, 0, 0, _arg_low(arg))] + [(JEQ_K, len(values) - i, 0, v) for i, v in enumerate(values)]
    raise ValueError(f"unknown seccomp condition {cond!r}")
