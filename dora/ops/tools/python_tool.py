"""The `python` tool: runs the model's code in the sandbox (dora/ops/tools/sandbox.py) and returns
what it printed (a last expression prints its repr, as in a notebook). An exception, a timeout, a
refused call or a limit reached returns an error observation: the output so far and one line saying
what happened. The run goes on; each failure is counted by kind (`failures`, in the generate op's
stats as tool_failures)."""

from __future__ import annotations

import collections
import signal
import threading
from typing import Any

from dora.graph.opspec import ParamSpec
from dora.ops.tools import isolation
from dora.ops.tools.sandbox import Limits, SandboxResult, run_python
from dora.ops.tools.sandbox_pool import WarmPool
from dora.ops.tools.sandbox_settings import SANDBOX_SETTINGS, sandbox_limits
from dora.ops.tools.tool_base import Tool, ToolResult, clip_text

P = ParamSpec


class PythonTool(Tool):
    kind = "python"
    doc = "run Python code in a sandbox (no network, time and memory limits); returns its output"
    main_arg = "code"
    settings = {s.name: s for s in (
        P("timeout_s", "float", 5.0, "wall-clock limit of one call (the sandbox is killed)", min=0.1, max=600),
        P("cpu_s", "int", 5, "CPU-time limit of one call (RLIMIT_CPU)", min=1, max=600),
        P("max_output_chars", "int", 2000, "output returned to the model, at most", min=16),
        *SANDBOX_SETTINGS,
    )}

    def __init__(self, name: str, **settings: Any):
        super().__init__(name, **settings)
        self.limits = sandbox_limits(self.cfg, wall_s=self.cfg["timeout_s"], cpu_s=self.cfg["cpu_s"])
        self.max_chars = self.cfg["max_output_chars"]
        self.pool = WarmPool(self.limits, self.cfg["warm"]) if self.cfg["warm"] else None
        self.failures: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    @classmethod
    def decl_problems(cls, decl: dict[str, Any]) -> list[tuple[str, str]]:
        return [(f"packages.{i}", msg) for i, msg in isolation.package_problems(decl.get("packages", []))]

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        code = self.text_arg(arguments, self.main_arg)
        if isinstance(code, ToolResult):
            return code
        r = run_python(code, self.limits, self.pool)
        out = clip_text(r.stdout.rstrip("\n"), self.max_chars)
        if r.ok:
            return ToolResult(out, error=False, seconds=r.seconds)
        kind, why = failure(r, self.limits)
        with self.lock:
            self.failures[kind] += 1
        why = "Error: " + why   # after the output (cut), so the model always reads it
        return ToolResult((out + "\n" if out else "") + why[:self.max_chars], error=True, seconds=r.seconds)

    def stats(self) -> dict[str, int]:
        with self.lock:
            return dict(self.failures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def failure(r: SandboxResult, limits: Limits) -> tuple[str, str]:
    """(kind, one line): why the run failed. Kinds: timeout, cpu, output, memory, disk, threads, refused,
    error (the code's own)."""
    if r.timed_out:
        return "timeout", f"timed out after {limits.wall_s:g} s (killed)"
    if r.returncode is not None and r.returncode < 0:
        sig = -r.returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "cpu", f"killed by {signal.Signals(sig).name} (over the CPU-time limit of {limits.cpu_s} s)"
        if sig == signal.SIGXFSZ:
            return "output", f"killed by SIGXFSZ (wrote more than the output limit of {limits.output_bytes} bytes)"
        return "error", f"killed by {signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig}"
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else f"exit status {r.returncode}"
    return _error_kind(last), last


def _error_kind(line: str) -> str:
    """What an exception line says happened: a limit (memory, disk, file size), a refusal by the sandbox
    (EPERM from seccomp, a read-only or absent file system), or the code's own error."""
    if line.startswith("MemoryError"):
        return "memory"
    if "can't start new thread" in line:   # RLIMIT_NPROC (max_threads)
        return "threads"
    if "No space left on device" in line:
        return "disk"
    if "File too large" in line:   # RLIMIT_FSIZE: CPython ignores SIGXFSZ, so the write fails instead
        return "output"
    if "Operation not permitted" in line or "Read-only file system" in line or line.startswith("PermissionError"):
        return "refused"
    return "error"
