"""What `dora validate` checks of a judge node (the op's `check`): no torch, no model loaded.

The rubric ({response} present, no unknown placeholder), the verdict parser (a regex that
compiles, a range lo < hi), and per engine: http needs a well-formed url and
no model; torch and vllm take the judge's own `model` section (checked as the pipeline's is) and
no url. Keys name the param, so each problem is reported at its file:line.
"""

from __future__ import annotations

from typing import Any

from dora.ops.judge.http_judge import url_problem
from dora.ops.judge.rubric import template_problem
from dora.ops.judge.verdicts import verdict_problems


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if template_problem(p["rubric"]):
        problems.append(("rubric", template_problem(p["rubric"])))
    problems += verdict_problems(p)
    if p["engine"] == "http":
        if url_problem(p["url"]):
            problems.append(("url", url_problem(p["url"])))
        if p["model"] is not None:
            problems.append(("model", "model is the judge's own weights for engine torch or vllm; an http judge's "
                                      "model is the server's (served_model)"))
    else:
        if p["url"] is not None:
            problems.append(("url", f"url is for engine http; engine {p['engine']} runs the judge here"))
        if p["model"] is not None:
            problems += model_section_problems(p["model"], p["engine"])
    if p["kv_cache_gb"] is not None and p["engine"] != "torch":
        problems.append(("kv_cache_gb", "kv_cache_gb sizes the torch engine's KV pool"))
    return problems


def model_section_problems(model: dict[str, Any], engine: str) -> list[tuple[str, str]]:
    """A node's own `model:` section (a judge's, a reward model's), checked as the pipeline's is."""
    from dora.ops.model_section import model_problems   # (only for a node that names a model of its own)

    problems = [(f"model.{key}" if key else "model", msg) for key, msg in model_problems(model)]
    if not problems and engine == "torch":
        from dora.ops.engines.paged import engine_problem
        problem = engine_problem(model)
        if problem:
            problems.append(("model", f"engine torch cannot run this judge model: {problem} (or use engine: vllm)"))
    return problems


def devices_problem(p: dict[str, Any], devices: int) -> str | None:
    """A judge replica with devices > 1 is a tensor-parallel group: engine vllm only (as generate)."""
    if devices > 1 and p["engine"] != "vllm":
        return (f"devices: {devices} asks for tensor parallelism, which engine {p['engine']!r} cannot do; use "
                "engine: vllm, or devices: 1 and more replicas")
    return None
