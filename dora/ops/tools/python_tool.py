"""The `python` tool: runs the model's code in the sandbox (dora/ops/tools/sandbox.py) and returns
what it printed (a last expression prints its repr, as in a notebook). An exception, a timeout or a
limit reached returns an error observation: the output so far and one line saying what happened."""

from __future__ import annotations

import signal
from typing import Any

from dora.graph.opspec import ParamSpec
from dora.ops.tools.sandbox import Limits, SandboxResult, run_python
from dora.ops.tools.tool_base import Tool, ToolResult, clip_text

P = ParamSpec


class PythonTool(Tool):
    kind = "python"
    doc = "run Python code in a sandboxed subprocess (no network, time and memory limits); returns its output"
    main_arg = "code"
    settings = {s.name: s for s in (
        P("timeout_s", "float", 5.0, "wall-clock limit of one call (the process group is killed)", min=0.1, max=600),
        P("cpu_s", "int", 5, "CPU-time limit of one call (RLIMIT_CPU)", min=1, max=600),
        P("memory_mb", "int", 256, "address-space limit of one call (RLIMIT_AS)", min=32),
        P("max_output_chars", "int", 2000, "output returned to the model, at most", min=16),
    )}

    def __init__(self, name: str, **settings: Any):
        super().__init__(name, **settings)
        self.limits = Limits(wall_s=self.cfg["timeout_s"], cpu_s=self.cfg["cpu_s"], memory_mb=self.cfg["memory_mb"])
        self.max_chars = self.cfg["max_output_chars"]

    def run(self, arguments: dict[str, Any]) -> ToolResult:
        code = self.text_arg(arguments, self.main_arg)
        if isinstance(code, ToolResult):
            return code
        r = run_python(code, self.limits)
        out = clip_text(r.stdout.rstrip("\n"), self.max_chars)
        if r.ok:
            return ToolResult(out, error=False, seconds=r.seconds)
        why = "Error: " + failure(r, self.limits)   # after the output (cut), so the model always reads it
        return ToolResult((out + "\n" if out else "") + why[:self.max_chars], error=True, seconds=r.seconds)


def failure(r: SandboxResult, limits: Limits) -> str:
    """One line: why the run failed."""
    if r.timed_out:
        return f"timed out after {limits.wall_s:g} s (killed)"
    if r.returncode is not None and r.returncode < 0:
        sig = -r.returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return f"killed by {signal.Signals(sig).name} (over the CPU-time limit of {limits.cpu_s} s)"
        if sig == signal.SIGXFSZ:
            return "killed by SIGXFSZ (wrote more than the output limit)"
        return f"killed by {signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig}"
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {r.returncode}"
