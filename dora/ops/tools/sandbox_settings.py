"""The sandbox settings a python tool and the code_exec reward share (declared once), and the
Limits they make."""

from __future__ import annotations

from typing import Any

from dora.graph.opspec import ParamSpec
from dora.ops.tools import isolation
from dora.ops.tools.sandbox import MODES, Limits, SandboxUnavailable, unavailable

P = ParamSpec
SANDBOX_SETTINGS = (
    P("sandbox", "str", "bwrap", "bwrap: OS isolation with bubblewrap (namespaces, uid 65534, read-only view of the "
      "interpreter only, seccomp); interpreter_only: the child confines itself from inside Python, NOT a security "
      "boundary (dora validate warns)", choices=MODES),
    P("packages", "list", [], "packages the code may import besides the standard library: installed top-level names "
      "(numpy) or paths of a package folder or module file, bound read-only into the sandbox"),
    P("memory_mb", "int", 256, "address-space limit of one call (RLIMIT_AS)", min=32),
    P("disk_mb", "int", 16, "size of the call's private scratch folder (/tmp, a tmpfs; bwrap)", min=1),
    P("max_threads", "int", 16, "threads one call may run (RLIMIT_NPROC in its user namespace; bwrap refuses new "
      "processes)", min=1),
    P("warm", "int", 2, "sandboxes started ahead of calls (hides bubblewrap's start-up; 0: start each on its call)",
      min=0, max=64),
)


def sandbox_limits(cfg: dict[str, Any], wall_s: float, cpu_s: int) -> Limits:
    """The sandbox limits from a tool's (or the code_exec reward's) checked settings; raises
    SandboxUnavailable when the machine cannot run the sandbox they ask for."""
    problem = unavailable(cfg["sandbox"])
    if problem:
        raise SandboxUnavailable(problem)
    return Limits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=cfg["memory_mb"], disk_mb=cfg["disk_mb"],
                  max_threads=cfg["max_threads"], mode=cfg["sandbox"],
                  packages=tuple(isolation.package_paths(cfg["packages"])))
