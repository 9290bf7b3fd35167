"""`run.loggers`: where step metrics go besides metrics.jsonl, checked at validation.

    run: {loggers: [jsonl, tensorboard, wandb]}      # default [jsonl]

metrics.jsonl is the run's own record (summary, dashboard, plots and resume read it), so it is
always written; `jsonl` names it so a list can be explicit. The others are optional packages:
a name that is unknown, or whose package is not installed, is an error here, before anything
starts. The writers live in dora/observe/metric_sinks.py; the setting is declared in RunConfig.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from dora.graph.diagnostics import Diagnostic, error
from dora.graph.model import Graph, SourceLoc
from dora.graph.opspec import did_you_mean

#: logger name -> (python package it needs or None, how to install it)
LOGGERS: dict[str, tuple[str | None, str]] = {
    "jsonl": (None, ""),
    "tensorboard": ("tensorboard", "pip install 'dora-rl[loggers]' (or pip install tensorboard)"),
    "wandb": ("wandb", "pip install 'dora-rl[loggers]' (or pip install wandb)"),
}
DEFAULT_LOGGERS = ("jsonl",)


def installed(package: str) -> bool:
    """Is the package importable? (looked up, not imported: wandb takes seconds to import)"""
    return importlib.util.find_spec(package) is not None


def check_loggers(value: Any, loc: SourceLoc | None = None) -> list[Diagnostic]:
    """Every problem of a `run.loggers` list: a name that is not a string, an unknown name, a duplicate,
    or a logger whose package is missing."""
    if not isinstance(value, (list, tuple)):   # None is the default; any other non-list fails the run section's type check
        return []
    if not all(isinstance(x, str) for x in value):
        return [error(f"run.loggers must be a list of logger names, got {value!r}", loc,
                      hint=f"e.g. [{', '.join(LOGGERS)}]")]
    diags = []
    for name in dict.fromkeys(value):
        if name not in LOGGERS:
            diags.append(error(f"run.loggers: unknown logger {name!r}", loc,
                               hint=did_you_mean(name, list(LOGGERS)) or f"loggers: {', '.join(LOGGERS)}"))
            continue
        package, how = LOGGERS[name]
        if package is not None and not installed(package):
            diags.append(error(f"run.loggers: logger {name!r} needs the {package!r} package, which is not installed",
                               loc, hint=how))
    dupes = sorted({x for x in value if value.count(x) > 1})
    if dupes:
        diags.append(error(f"run.loggers lists {', '.join(map(repr, dupes))} more than once", loc))
    return diags


def loggers_of(g: Graph) -> list[str]:
    """The loggers a validated graph asks for (jsonl always first)."""
    return list(dict.fromkeys(["jsonl", *(g.run.loggers or DEFAULT_LOGGERS)]))


def validate_loggers(g: Graph) -> list[Diagnostic]:
    return check_loggers(g.run.loggers, g.loc_of("run.loggers"))
