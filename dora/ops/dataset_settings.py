"""The dataset op's `source` as `dora validate` checks it (its OpSpec's `names_from`), kept apart from
the op so that checking a pipeline loads neither pyarrow nor reasoning-gym's task code. (The rows of a
file source are checked with the model's tokenizer and the prompt limit: dora/graph/prompt_limits.py.)

reasoning-gym registers its datasets by importing every task module (2-4 s: sympy and friends), so the
names are read once per installed version and kept in the dora cache (`reasoning_gym_names`).
"""

from __future__ import annotations

import hashlib
import json
import os

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def is_file_source(source: str) -> bool:
    return source.endswith(FILE_SUFFIXES)


def check_params(p: dict) -> list[tuple[str, str]]:
    """The dataset op's rules across params (dora validate): a synthetic task's `task_params` are the
    arguments its generator takes, with values it accepts (one row is generated to find out)."""
    problem = task_params_problem(p["source"], p["task_params"], p["seed"])
    return [("task_params", problem)] if problem else []


def task_params_problem(source: str, task_params: dict, seed: int = 0) -> str | None:
    """What a synthetic task's generator says of `task_params` (None: fine, or not a synthetic task)."""
    if not source.startswith("synthetic:") or source_problem(source):
        return None
    from dora.ops.tasks import get_task

    try:
        get_task(source).make(1, seed, **task_params)
    except (TypeError, ValueError) as e:
        return f"{source}: bad task_params {task_params}: {e}"
    return None


def source_problem(source: str) -> str | None:
    """What is wrong with a `source` param before any data is read (None: it can be loaded)."""
    from dora.graph.opspec import did_you_mean
    if source.startswith("synthetic:"):
        from dora.ops.tasks import TASKS

        name = source.split(":", 1)[1]
        if name in TASKS:
            return None
        return f"unknown synthetic task {name!r} ({did_you_mean(name, sorted(TASKS)) or 'tasks: ' + ', '.join(sorted(TASKS))})"
    if source.startswith("reasoning_gym:"):
        names = reasoning_gym_names()
        if names is None:
            return f"source {source} needs reasoning-gym: pip install reasoning-gym"
        name = source.split(":", 1)[1]
        if name in names:
            return None
        return f"unknown reasoning-gym dataset {name!r} ({did_you_mean(name, names) or 'see reasoning_gym.factory.DATASETS'})"
    if is_file_source(source):
        return None if os.path.isfile(source) else f"dataset file {source!r} does not exist (paths are relative to where dora runs)"
    return f"source {source!r}: expected synthetic:NAME, reasoning_gym:NAME, or a path ending in .jsonl or .parquet"


def reasoning_gym_names() -> list[str] | None:
    """The dataset names of the installed reasoning-gym (None: not installed), from a cache file keyed
    by its version and install path, written at the first look (which imports it)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None or spec.origin is None:
        return None
    try:
        version = importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    from dora.ops.model_section import cache_dir   # (~/.cache/dora/models: the cache sits beside it)
    where = hashlib.sha256(f"{spec.origin}:{os.path.getmtime(spec.origin)}".encode()).hexdigest()[:12]
    key = f"{version}-{where}"
    path = os.path.join(os.path.dirname(cache_dir()), f"reasoning_gym-{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            return list(json.load(f))
    except (OSError, ValueError):
        pass
    from reasoning_gym.factory import DATASETS

    names = sorted(DATASETS)
    try:   # a cache: a folder we cannot write costs only the next look's import
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(names, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return names
