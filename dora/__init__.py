"""dora: asynchronous RL post-training of language models as graphs of operators.

    import dora
    p = dora.Pipeline("grpo", model={...}, pools={...})   # build (or dora.load("pipelines/grpo.yaml"))
    p.print(params=True); dora.validate(p); dora.draw(p, "grpo.html")
    summary = dora.run(p, out="runs/grpo", overrides=["nodes.train.params.steps=2"])

docs/python.md walks through it. The names below are imported at first use, so `import dora` (and
the `dora` command) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {   # name -> module that defines it
    "Pipeline": "dora.graph.builder", "BuildError": "dora.graph.builder",
    "Graph": "dora.graph.model", "Diagnostic": "dora.graph.diagnostics", "GraphError": "dora.graph.diagnostics",
    "BadInput": "dora.graph.diagnostics", "LaunchRefused": "dora.rl.launch",
    "RunError": "dora.api", "RunBadInput": "dora.api",
    "load": "dora.api", "validate": "dora.api", "draw": "dora.api", "run": "dora.api",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from dora.api import RunBadInput, RunError, draw, load, run, validate
    from dora.graph.builder import BuildError, Pipeline
    from dora.graph.diagnostics import BadInput, Diagnostic, GraphError
    from dora.graph.model import Graph
    from dora.rl.launch import LaunchRefused


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dora' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value   # (once)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
