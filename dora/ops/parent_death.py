"""Children that die with their parent: a worker with `dora run`, a vLLM process with its worker.

Linux's PR_SET_PDEATHSIG delivers SIGKILL to a process when the thread that started it exits, so
a kill -9 of `dora run` leaves no worker or engine process behind. Elsewhere it is a no-op.
"""

from __future__ import annotations

import sys


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (use as a Popen preexec_fn)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except Exception:
        pass
