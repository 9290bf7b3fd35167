"""The `sandbox: interpreter_only` confinement (stdlib only; imported by sandbox_child.py in that
mode): no OS isolation, only what an unprivileged Python process can do to itself. It is not a
security boundary: an audit hook sees only the calls that raise audit events, and a model's code can
reach around it (a process started through a call that raises none runs unconfined). `dora validate`
warns about every tool that uses it.

1. network: a new, empty network namespace (unshare(CLONE_NEWNET); unprivileged:
   CLONE_NEWUSER | CLONE_NEWNET), where no interface is up. Where neither is allowed, the audit
   hook refuses every socket instead.
2. privileges: running as root, the child becomes nobody (uid/gid 65534) when nobody can read the
   interpreter's standard library (else it stays root).
3. an audit hook (sys.addaudithook, which code cannot remove) refusing sockets (fallback only), new
   processes, signals to other processes, ctypes, and file changes outside the scratch folder.
"""

import os
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
NOBODY = 65534
PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.kill",
                  "os.killpg", "subprocess.Popen", "os.startfile", "pty.spawn")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.utime", "os.chflags", "os.lchflags", "shutil.rmtree", "shutil.copyfile",
               "shutil.copymode", "shutil.copystat", "shutil.move")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def unshare_network() -> str:
    """'netns' when the child now sits in an empty network namespace, else 'audit'."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
            if libc.unshare(flags) == 0:
                return "netns"
        return "audit"
    finally:
        del libc
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
            del sys.modules[name]


def world_readable(path: str) -> bool:
    """Whether every folder on the way to `path` lets others through (and `path` itself lets them read)."""
    import stat

    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def drop_root() -> None:
    if os.getuid() == 0 and world_readable(sys.base_prefix) and world_readable(os.path.dirname(os.__file__)):
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def make_guard(scratch: str, refuse_network: bool):
    scratch = os.path.realpath(scratch)

    def inside(path) -> bool:
        if isinstance(path, int):    # an open file descriptor: already allowed when it was opened
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == scratch or real.startswith(scratch + os.sep)

    def guard(event: str, args: tuple) -> None:
        if event.startswith("ctypes."):
            raise PermissionError(f"sandbox: {event} is refused (no foreign function calls)")
        if event in PROCESS_EVENTS:
            raise PermissionError(f"sandbox: {event} is refused (no new processes or signals)")
        if refuse_network and event.startswith("socket."):
            raise PermissionError(f"sandbox: {event} is refused (no network)")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is refused (only the scratch folder is writable)")
        if event in PATH_EVENTS:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(p) for p in paths):
                raise PermissionError(f"sandbox: {event} outside the scratch folder is refused")

    return guard
