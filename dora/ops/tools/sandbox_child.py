"""The sandboxed Python child: run as a script (`python -I -S -B sandbox_child.py CONFIG_JSON`, stdlib
only, never imported by dora). It confines itself, then reads its payload from stdin and runs it
(so a sandbox can be started ahead of its call: sandbox.py's warm pool).

CONFIG comes from sandbox.py: the mode, the limits and (mode bwrap) the process filter. The payload
is {"kind": "cell", "code": ...} (the python tool: a notebook cell) or {"kind": "tests", ...}
(the code_exec reward: sandbox_harness.py).

mode "bwrap": the child already sits in bubblewrap's namespaces (isolation.py) under the base
seccomp filter. Before any payload code runs it adds
1. the process filter (seccomp_bpf.process_filter(), compiled by the parent and passed as hex),
   installed with prctl through ctypes: no exec, no fork or vfork, clone only for threads. A child
   that cannot install it exits 3 without running anything;
2. rlimits: CPU seconds, address space, file size (stdout and stderr are files the parent reads
   back; the scratch tmpfs has its own size), threads (RLIMIT_NPROC, counted in the sandbox's own
   user namespace), open files, no core files.
mode "interpreter_only" (the loudly named opt-out, no OS isolation): sandbox_audit.py's
confinement, an audit hook that a Python-level escape can get around.
The first stderr line names the isolation in effect: "\\x00dora-sandbox: <isolation>".
Like a notebook cell, a last line that is an expression prints its repr.
"""

import ast
import builtins
import json
import os
import resource
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
REFUSED_EXIT = 3


def install_process_filter(program: bytes) -> None:
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def set_limits(cfg: dict) -> None:
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(cfg["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    out = int(cfg["output_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("max_threads"):
        resource.setrlimit(resource.RLIMIT_NPROC, (int(cfg["max_threads"]),) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def confine(cfg: dict) -> str:
    """Confine this process as cfg["mode"] says; the isolation in effect, in words."""
    if cfg["mode"] == "bwrap":
        program = bytes.fromhex(cfg["process_filter"])
        if program:
            install_process_filter(program)
        set_limits(cfg)
        return "bwrap uid %d, seccomp %s" % (os.getuid(), "on" if program else "unavailable on this architecture")
    import sandbox_audit

    network = sandbox_audit.unshare_network() if cfg["netns"] else "audit"
    set_limits(cfg)
    sandbox_audit.drop_root()
    os.chdir(cfg["scratch"])
    sys.addaudithook(sandbox_audit.make_guard(cfg["scratch"], refuse_network=network != "netns"))
    return "interpreter_only, network " + network


def run_cell(code: str) -> int:
    """Exit status: 0, or 1 after printing the traceback of the cell's own frames."""
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
    scope = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(tree, "<tool>", "exec"), scope)
    if last is not None:
        value = eval(compile(last, "<tool>", "eval"), scope)
        if value is not None:
            print(repr(value))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)   # the sibling scripts; taken off again before the payload runs
    import sandbox_harness
    try:
        isolation = confine(cfg)
    except OSError as e:
        sys.stderr.write(f"\x00dora-sandbox: refused\nsandbox: could not confine the child ({e}); nothing was run\n")
        sys.exit(REFUSED_EXIT)
    finally:
        sys.path.remove(here)
    if cfg.get("packages_dir"):
        sys.path.append(cfg["packages_dir"])
    builtins.exit = builtins.quit = sys.exit   # -S leaves them out (they come from site)
    sys.stderr.write(f"\x00dora-sandbox: {isolation}\n")
    sys.stderr.flush()
    payload = json.loads(sys.stdin.read())   # confined first: a warm sandbox waits here for its call
    if payload.get("cpu_s"):   # this call's CPU limit, when it differs from the pool's (lower only)
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        cpu = min(int(payload["cpu_s"]), soft)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, min(cpu + 1, hard)))
    status = run_cell(payload["code"]) if payload["kind"] == "cell" else sandbox_harness.run_tests(payload)
    sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
