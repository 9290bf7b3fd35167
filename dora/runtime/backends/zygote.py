"""The zygote: one process per local run that imports what every worker needs (torch, transformers,
pyarrow, zmq, the built-in ops) once, then forks each worker from itself.

A worker started from scratch spends seconds of CPU importing the same modules as its siblings (a
quickstart run has five); forked from the zygote it starts with them loaded, sharing their memory
copy-on-write. The zygote never initialises CUDA, starts no thread and opens no socket, so a fork
is a clean start: the child sets its own environment (CUDA_VISIBLE_DEVICES is read when CUDA
initialises, thread counts are set by the worker), points stdout and stderr at its log, and runs
the same `dora.runtime.worker.main` a `python -m dora.runtime.worker` process would.

Protocol, one JSON object per line. The backend writes requests on the zygote's stdin:
    {"label", "argv": [worker arguments], "env": {full environment}, "log": path | null}
and the zygote answers on stdout: {"ready": true} once it has imported everything, {"label",
"pid"} for each fork, and {"exit": label, "pid", "rc"} when a worker ends (rc as Popen gives it:
negative for a signal). The zygote dies with the run (PR_SET_PDEATHSIG) and its workers with it;
it exits when its stdin closes.

Run: python -m dora.runtime.backends.zygote [--title-room=...] (room for the workers' command
lines: dora/runtime/backends/proc_title.py)
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys

from dora.runtime.backends.proc_title import set_cmdline

# What the built-in ops import: loaded once here instead of once per worker.
PRELOAD = ("dora.runtime.worker", "torch", "transformers", "dora.ops.dataset", "dora.ops.generate",
           "dora.ops.reward", "dora.ops.advantage", "dora.ops.filter", "dora.ops.update", "dora.ops.reference",
           "dora.ops.critic")


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _child(req: dict, protocol_fds: tuple[int, ...]) -> None:
    """In the forked child: become the worker, and never return."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in protocol_fds:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if req.get("log") else \
            os.open(os.devnull, os.O_WRONLY)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["dora.runtime.worker", *req["argv"]]
        set_cmdline([sys.executable, "-m", "dora.runtime.worker", *req["argv"]], req["label"])   # what ps shows
        from dora.runtime.worker import main
        code = main(req["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(children: dict[int, str]) -> None:
    """Report every child that ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        label = children.pop(pid, None)
        if label is not None:
            _send({"exit": label, "pid": pid, "rc": os.waitstatus_to_exitcode(status)})


def main() -> int:
    from dora.ops.parent_death import die_with_parent

    die_with_parent()                          # a kill -9 of dora run takes the zygote, and so its workers
    set_cmdline([sys.executable, "-m", "dora.runtime.backends.zygote"], "dora-zygote")
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # as workers do: the controller decides how a run stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:                      # a worker that needs it will say why, in its own log
            pass
    wake_r, wake_w = os.pipe()                 # SIGCHLD -> a byte here, so select() wakes to reap
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, str] = {}
    stdin, pending = sys.stdin.fileno(), b""
    _send({"ready": True})
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(children)
        if stdin not in ready:
            continue
        chunk = os.read(stdin, 1 << 16)
        if not chunk:                          # the backend closed us: its workers are gone or going
            return 0
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(req, (stdin, sys.stdout.fileno(), wake_r, wake_w))
            children[pid] = req["label"]
            _send({"label": req["label"], "pid": pid})

if __name__ == "__main__":
    sys.exit(main())
