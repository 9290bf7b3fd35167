"""Python as a first-class way in: what the `dora` command does, as functions (docs/python.md).

    import dora
    p = dora.Pipeline("grpo", model={...}, pools={...})    # the builder (dora/graph/builder.py)
    ...                                                    # nodes and edges, as in YAML
    p.print(params=True)                                   # the graph, with each node's params
    dora.validate(p)                                       # every diagnostic, as `dora validate`
    dora.draw(p, "grpo.html")                              # as `dora viz`
    summary = dora.run(p, out="runs/grpo", overrides=["nodes.train.params.steps=2"])

Each function takes a Pipeline, a Graph or a pipeline YAML path, and `overrides` as the command line
writes them (`nodes.train.params.steps=2`). `run` goes through the very checks `dora run` does
(validation, resolve, placement, the run folder) and the same execution, and returns the run's
summary.json as a dict. Bad input raises, never runs: GraphError (every diagnostic, each naming the
YAML or Python file:line), LaunchRefused (a run folder holding another run, a GPU pool this machine
cannot hold, ...), RunError when the run itself failed or was stopped (RunBadInput when it found bad
input while running, e.g. a data file's row, which `dora run` exits 2 on).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from dora.graph.builder import Pipeline
from dora.graph.diagnostics import BadInput, Diagnostic, GraphError, errors_of
from dora.graph.model import Graph

__all__ = ["RunBadInput", "RunError", "draw", "load", "run", "validate"]


class RunError(RuntimeError):
    """A run that started and did not finish: `summary` is its summary.json, `exit_code` what `dora
    run` would have exited with (1 failed, 130 / 143 stopped by SIGINT / SIGTERM after a checkpoint)."""

    def __init__(self, summary: dict[str, Any], exit_code: int):
        self.summary, self.exit_code = summary, exit_code
        how = "was stopped" if summary.get("ended") == "preempted" else "failed"
        super().__init__(f"run {summary.get('run_dir', '')} {how}: {summary.get('error') or summary.get('stop_reason')}")


class RunBadInput(RunError, BadInput):
    """The run found bad input while running (a data file's row, named file:line): exit 2 for `dora run`."""


def load(path: str, overrides: Iterable[str] = ()) -> Graph:
    """A pipeline file with its overrides, validated: GraphError listing every error if it is not valid."""
    from dora.graph.validate import load_and_validate

    return load_and_validate(path, list(overrides))


def graph_of(pipeline: Pipeline | Graph | str, overrides: Iterable[str] = ()) -> tuple[Graph | None, list[Diagnostic]]:
    """(the Graph with overrides applied, or None, the load diagnostics) of what the caller gave."""
    from dora.graph.yaml_io import load_file, override_graph

    overrides = [overrides] if isinstance(overrides, str) else list(overrides)   # one override, as a string
    if isinstance(pipeline, (str, os.PathLike)):
        return load_file(os.fspath(pipeline), list(overrides))
    if isinstance(pipeline, Pipeline):
        pipeline = pipeline.graph
    if not isinstance(pipeline, Graph):
        raise TypeError(f"expected a dora.Pipeline, a dora.Graph or a pipeline file path, got {type(pipeline).__name__}")
    return override_graph(pipeline, overrides)


def validate(pipeline: Pipeline | Graph | str, overrides: Iterable[str] = ()) -> list[Diagnostic]:
    """Every error and warning, each naming its file:line (YAML or the Python line that made it): what
    `dora validate` prints. An empty list: the pipeline is valid."""
    from dora.graph.validate import validate as check

    g, diags = graph_of(pipeline, overrides)
    return diags + (check(g) if g is not None and not errors_of(diags) else [])


def draw(pipeline: Pipeline | Graph | str, path: str | None = None, fmt: str | None = None,
         overrides: Iterable[str] = ()) -> str:
    """The graph drawn as `dora viz` draws it: written to `path` (its extension picks html, svg, dot or
    mmd) and the path returned, or without a path the text (fmt, default mmd)."""
    from dora.graph import viz

    g, diags = graph_of(pipeline, overrides)
    if g is None:
        raise GraphError(diags)
    fmt = fmt or (viz.format_of(path) if path else "mmd")
    text = viz.render(g, fmt)
    if path is None:
        return text
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def run(pipeline: Pipeline | Graph | str | None, out: str | None = None, overrides: Iterable[str] = (), *,
        resume: bool = False, overwrite: bool = False, seed: int | None = None, backend: str = "local",
        quiet: bool = False, deadline_s: float | None = None, dashboard_port: int | None = None,
        **timeouts: float) -> dict[str, Any]:
    """Run a pipeline as `dora run` does and return its summary (summary.json as a dict).

    out: the run folder (default run.out, else runs/<name>-<time>); one holding another run is refused
    unless overwrite=True, or resume=True, which continues that run from its last complete checkpoint
    with its own pipeline.yaml (`pipeline` may then be None; if given it must be that pipeline).
    timeouts: start_timeout_s, stall_timeout_s, hb_timeout (seconds), as dora run's options."""
    from dora.graph.yaml_io import load_file
    from dora.rl.launch import LaunchRefused, checkpoint_to_resume, execute, prepare, run_folder

    unknown = set(timeouts) - {"start_timeout_s", "stall_timeout_s", "hb_timeout"}
    if unknown:
        raise TypeError(f"dora.run() got unknown keyword(s) {sorted(unknown)}")
    checkpoint = None
    if resume:
        if out is None:
            raise LaunchRefused("resume=True needs out=RUN_DIR, the run to continue")
        own, diags = load_file(run_folder(out))
        if own is None or errors_of(diags):
            raise GraphError(diags)
        given = graph_of(pipeline)[0] if pipeline is not None else own
        if given != own:
            raise LaunchRefused(f"resume=True continues the run in {out} as it was: the pipeline given differs from "
                                f"its pipeline.yaml (pass None, or overrides for what may change)")
        pipeline = own
        checkpoint = checkpoint_to_resume(out, own)
    elif pipeline is None:
        raise TypeError("dora.run() needs a pipeline (or resume=True with out=RUN_DIR)")
    g, diags = graph_of(pipeline, overrides)
    if g is None or errors_of(diags):
        raise GraphError(diags)
    from dora.graph.validate import check
    check(g)   # GraphError listing every error, each at its file:line
    source = pipeline if isinstance(pipeline, str) else g.source_file
    launch = prepare(g, backend=backend, out=out, seed=seed, resume=checkpoint, overwrite=overwrite, source=source)
    path = os.path.join(launch.run_dir, "summary.json")
    earlier = _mtime(path)   # (an earlier run's, with overwrite or resume: this run writes its own)
    code = execute(g, launch.run_dir, backend=backend, seed=launch.seed, quiet=quiet, deadline_s=deadline_s,
                   source=source, resolved=launch.resolved, resume=checkpoint, dashboard_port=dashboard_port, **timeouts)
    if _mtime(path) in (None, earlier):   # refused before it started (what stood in the way is on stderr)
        raise LaunchRefused(f"the run in {launch.run_dir} did not start (exit {code}); the reason is printed above")
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    if code == 2:
        raise RunBadInput(summary, code)
    if code != 0:
        raise RunError(summary, code)
    return summary


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None
