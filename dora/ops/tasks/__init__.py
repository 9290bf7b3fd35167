"""Synthetic tasks: procedural prompts with a built-in scorer, selected by name.

A task is a module-level object with
    name: str
    make(size: int, seed: int, **params) -> list[dict]   # rows with at least "prompt" and "answer"
    score(response_text: str, answer: str) -> float      # reward in [0, 1]
    propose(response_text, source_prompt, **params) -> {prompt, answer}   # optional: a trajectory of
                                                         # another policy as a problem (dora/ops/to_prompts.py)
The dataset op uses `make` for source "synthetic:NAME"; the reward op's fn "synthetic" calls
`score` of the task named in each row's `task` column ("synthetic:NAME").
"""

from __future__ import annotations

import importlib

TASKS = {
    "quickstart": "dora.ops.tasks.quickstart:TASK",
    "quickstart_propose": "dora.ops.tasks.quickstart:PROPOSE",
    "arithmetic": "dora.ops.tasks.arithmetic:TASK",
    "tool_arithmetic": "dora.ops.tasks.tool_arithmetic:TASK",
    "code_functions": "dora.ops.tasks.code_functions:TASK",
}


def get_task(name: str):
    """The task object for a name (with or without the "synthetic:" prefix)."""
    name = name.split(":", 1)[1] if name.startswith("synthetic:") else name
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; known: {sorted(TASKS)}")
    module, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)
