"""The sandboxed Python child: run as a script (`python -I -S -B sandbox_child.py LIMITS_JSON`,
stdlib only, never imported by dora) that confines itself, then runs the code read from stdin.

Confinement, in order (each step before any model code runs):
1. network: a new, empty network namespace (unshare(CLONE_NEWNET); unprivileged:
   CLONE_NEWUSER | CLONE_NEWNET), where no interface is up, so nothing can be reached, not even
   127.0.0.1. Where neither is allowed, step 5's audit hook refuses every socket instead.
2. resource limits: CPU seconds (SIGXCPU, then SIGKILL at +1 s), address space, file size
   (stdout and stderr are files the parent reads back), no core files.
3. privileges: running as root, the child becomes nobody (uid/gid 65534) so it cannot change the
   host, when nobody can read the interpreter's standard library (a Python under a 0700 /root
   cannot be; then it stays root and step 5's file guard is what protects the host).
4. working directory: its own scratch folder.
5. an audit hook (sys.addaudithook, which code cannot remove) refusing sockets (fallback mode
   only), new processes (fork, exec, spawn, subprocess, os.system), signals to other processes,
   foreign function calls (ctypes: it could undo all of this), and file changes outside the scratch folder.
The first stderr line reports the network isolation in effect: "\\x00dora-sandbox: netns|audit".
Like a notebook cell, a last line that is an expression prints its repr.
"""

import ast
import json
import os
import resource
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


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    out = int(limits["output_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


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


def run_code(code: str) -> int:
    """Exit status: 0, or 1 after printing the traceback of the tool's own frames."""
    try:
        _run(code)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException as e:   # the model's error is the observation: its frames only
        import traceback

        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<tool>":
            tb = tb.tb_next
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb)))
        return 1
    return 0


def _run(code: str) -> None:
    tree = ast.parse(code, "<tool>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<tool>", "exec"), scope)
    if last is not None:
        value = eval(compile(last, "<tool>", "eval"), scope)
        if value is not None:
            print(repr(value))


def main() -> None:
    limits = json.loads(sys.argv[1])
    code = sys.stdin.read()
    network = unshare_network() if limits["netns"] else "audit"
    set_limits(limits)
    drop_root()
    os.chdir(limits["scratch"])
    sys.stderr.write(f"\x00dora-sandbox: {network}\n")
    sys.stderr.flush()
    sys.addaudithook(make_guard(limits["scratch"], refuse_network=network != "netns"))
    status = run_code(code)
    sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
