"""`run.loggers`: where step metrics go besides metrics.jsonl, checked at validation.

    run: {loggers: [jsonl, tensorboard, wandb]}      # default [jsonl]
    run: {wandb: {project: P, entity: E, name: N, mode: online}}   # optional; see wandb_run()

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


WANDB_KEYS = {"project": "WANDB_PROJECT", "entity": "WANDB_ENTITY", "name": "WANDB_NAME", "mode": "WANDB_MODE"}
WANDB_MODES = ("offline", "online")


def check_wandb(value: Any, loc: SourceLoc | None = None) -> list[Diagnostic]:
    """Every problem of a `run.wandb` mapping: an unknown key (did-you-mean), a value that is not a
    string, a mode other than offline or online."""
    if not isinstance(value, dict):   # (the run section's type check names a non-mapping)
        return []
    diags = []
    for key, v in value.items():
        if key not in WANDB_KEYS:
            diags.append(error(f"run.wandb: unknown key {key!r}", loc,
                               hint=did_you_mean(str(key), list(WANDB_KEYS)) or f"keys: {', '.join(WANDB_KEYS)}"))
        elif v is not None and not isinstance(v, str):
            diags.append(error(f"run.wandb.{key} must be a string, got {v!r}", loc))
        elif key == "mode" and v is not None and v not in WANDB_MODES:
            diags.append(error(f"run.wandb.mode must be one of {list(WANDB_MODES)}, got {v!r}", loc,
                               hint=did_you_mean(v, list(WANDB_MODES))))
    return diags


def wandb_run(options: dict[str, Any], pipeline: str, run_dir_name: str, env: Any = None) -> dict[str, Any]:
    """wandb.init's project, entity, name and mode: the pipeline's run.wandb, else the WANDB_* environment,
    else project = the pipeline's name, name = the run folder's, mode offline (entity: W&B's default)."""
    import os
    env = os.environ if env is None else env
    got = {key: options.get(key) or env.get(var) or None for key, var in WANDB_KEYS.items()}
    return {"project": got["project"] or pipeline, "entity": got["entity"], "name": got["name"] or run_dir_name,
            "mode": got["mode"] or "offline"}


def validate_loggers(g: Graph) -> list[Diagnostic]:
    return check_loggers(g.run.loggers, g.loc_of("run.loggers")) + check_wandb(g.run.wandb, g.loc_of("run.wandb"))
