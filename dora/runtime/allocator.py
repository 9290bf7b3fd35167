"""Keep large freed buffers inside the process, so zero-copy receives do not page-fault.

A batch received with copy=False lives in the buffer zmq's I/O thread malloc'ed for the frame
(0.1-16 MB for real batches). glibc serves such sizes with fresh mmaps, or trims the freed top of
its heap back to the kernel, so the next message's buffer is new memory that faults in page by
page: at 1 MB per message the receiving process took ~60 minor faults and ~140 us of kernel time
per message more than a receiver whose buffers got reused (benchmarks/channel.py, see
docs/benchmarks.md). Raising the mmap threshold to glibc's maximum (32 MB) and the trim threshold
above it keeps freed buffers for reuse; the cost is up to `trim_threshold` of free memory held per
malloc arena, which is small beside a worker's model and KV cache.

Opt out with DORA_MALLOC_TUNE=0. A no-op (returns False) off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1      # glibc <malloc.h> parameter numbers
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # glibc's largest allowed value (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20

_done: bool | None = None


def tune_malloc() -> bool:
    """Set the thresholds once per process; True if glibc accepted them."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("DORA_MALLOC_TUNE", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt            # glibc only (musl has none)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting either threshold also turns off glibc's own dynamic
    # adjustment of both, so both are set
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
