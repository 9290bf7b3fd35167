"""A forked worker's command line, as ps, top and /proc/PID/cmdline show it.

A worker forked from the zygote would otherwise show the zygote's command line. Like servers that
fork their workers (PostgreSQL, gunicorn via setproctitle), the process rewrites the memory the
kernel reads /proc/PID/cmdline from (between arg_start and arg_end of /proc/self/stat) with its own
arguments, NUL-separated, so `ps` and `pgrep -f -- '--node rollout'` see it as if it had been
started as `python -m dora.runtime.worker ...`. The zygote is started with room reserved for that
(ROOM); CPython keeps its own copy of argv, so nothing reads the old bytes again. Linux only; a
no-op elsewhere.
"""

from __future__ import annotations

import ctypes
import sys

ROOM = 1024   # bytes of command line the zygote reserves for its workers' titles


def room_argument() -> str:
    """An argument that reserves ROOM bytes of command line (the zygote ignores it)."""
    return "--title-room=" + "." * ROOM


def set_cmdline(args: list[str], name: str) -> bool:
    """Show `args` as this process's command line (cut to the room there is) and `name` (15 bytes)
    as its name in top; False if it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()   # fields after the command name, from field 3
        start, end = int(fields[45]), int(fields[46])     # arg_start, arg_end: fields 48 and 49
        data = b"\0".join(a.encode() for a in args)[:end - start - 1]
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)   # PR_SET_NAME
        return True
    except (OSError, ValueError, IndexError):
        return False
