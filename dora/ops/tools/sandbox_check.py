"""What `dora validate` and `dora run` check on this machine before a pipeline that runs model-written
code starts (OpSpec.host_check of the generate and reward ops): the sandbox each python tool or
code_exec reward asks for can start here, else an error naming what to install (exit 2, nothing
run); and a warning for every `sandbox: interpreter_only`, which is no security boundary."""

from __future__ import annotations

from typing import Any

from dora.ops.tools.sandbox import unavailable

INTERPRETER_ONLY_WARNING = (
    "{what} runs model-written code with `sandbox: interpreter_only`: no OS isolation, only an audit hook inside "
    "the interpreter, which that code can get around (it is not a security boundary). Use the default `sandbox: "
    "bwrap` (install bubblewrap), and where that cannot run, run dora in a VM you can lose")


def sandbox_problems(mode: str, key: str, what: str) -> list[tuple[str, str, str]]:
    if mode == "interpreter_only":
        return [(f"{key}.sandbox" if key else "sandbox", "warning", INTERPRETER_ONLY_WARNING.format(what=what))]
    problem = unavailable(mode)
    return [(key or "sandbox", "error", f"{what}: {problem}")] if problem else []


def generate_host_problems(params: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each python tool's sandbox (the tools list is already checked)."""
    out = []
    for i, decl in enumerate(params.get("tools") or []):
        if decl.get("kind", decl["name"]) == "python":
            out += sandbox_problems(decl.get("sandbox", "bwrap"), f"tools.{i}", f"tool {decl['name']!r}")
    return out


def reward_host_problems(params: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each code_exec reward (fn, or a weighted source's fn; sources are already checked): its
    params, then its sandbox."""
    uses = [("params", params.get("params") or {})] if params.get("fn") == "code_exec" else []
    uses += [(f"sources.{i}.params", s.get("params") or {}) for i, s in enumerate(params.get("sources") or [])
             if isinstance(s, dict) and s.get("fn") == "code_exec"]
    out = []
    for key, p in uses:
        out += _code_exec_problems(p, key)
    return out


def _code_exec_problems(params: dict[str, Any], key: str) -> list[tuple[str, str, str]]:
    from dora.ops.tools.code_exec import params_problems

    problems = params_problems(params)
    if problems:
        return [(f"{key}.{k}" if k else key, "error", m) for k, m in problems]
    return sandbox_problems(params.get("sandbox", "bwrap"), key, "reward fn 'code_exec'")
