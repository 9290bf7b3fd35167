"""The generate op's rules across params, which `dora validate` runs (its OpSpec's `check` and
`devices_check`): kept apart from the op so that checking a pipeline loads no engine, torch or
transformers.
"""

from __future__ import annotations

from typing import Any

from dora.ops.tools.tool_parsers import stop_parser_problem
from dora.ops.tools.tool_registry import tools_problems


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Rules across generate's params (dora validate runs them; see OpSpec.check)."""
    if p["weight_sync"] == "broadcast" and p["engine"] != "torch":
        return [("weight_sync", "weight_sync: broadcast needs engine: torch (vllm loads weights from files)")]
    if p["kv_cache_gb"] is not None and p["engine"] != "torch":
        return [("kv_cache_gb", "kv_cache_gb sizes the torch engine's KV pool; vllm sizes its own")]
    return multiturn_problems(p)


def multiturn_problems(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Tools and turns: every tool declaration checked (keys name the list entry: file:line)."""
    problems = tools_problems(p["tools"])
    if problems:
        return problems
    if p["tools"] and p["max_turns"] < 2:
        return [("max_turns", f"tools are declared but max_turns is {p['max_turns']}: the model would never read a "
                              "tool's output (set max_turns >= 2)")]
    if not p["tools"] and p["max_turns"] > 1:
        return [("max_turns", f"max_turns {p['max_turns']} needs tools: without a tool call a trajectory is one turn")]
    if p["tools"] and "{observation}" not in p["observation_template"]:
        return [("observation_template", "observation_template must contain {observation} (where the tool output goes)")]
    if p["tools"] and p["tool_parser"] == "stop" and stop_parser_problem([d["name"] for d in p["tools"]], p["stop"]):
        return [("tool_parser", stop_parser_problem([d["name"] for d in p["tools"]], p["stop"]))]
    if p["tools"] and p["max_total_tokens"] < p["max_tokens"]:
        return [("max_total_tokens", f"max_total_tokens {p['max_total_tokens']} is below max_tokens {p['max_tokens']} "
                                     "(one turn could not use its own limit)")]
    return []


def devices_problem(p: dict[str, Any], devices: int) -> str | None:
    """A generate replica with devices > 1 is a tensor-parallel group: only vLLM shards a model so
    (tensor_parallel_size = devices); the torch engine runs a replica on one device."""
    if devices > 1 and p["engine"] != "vllm":
        return (f"devices: {devices} asks for tensor parallelism, which engine {p['engine']!r} cannot do "
                "(it runs a replica on one device); use engine: vllm, or devices: 1 and more replicas")
    return None


def prompt_room(p: dict[str, Any], context: int) -> tuple[int, str]:
    """(the longest prompt a generate node with params `p` takes, given the model's context, and why):
    the torch engine refuses a request with no position left to generate (its response is cut at the
    context), vLLM one whose prompt + max_tokens exceed it (dora/ops/engines/paged/checks.py,
    vllm_engine.py)."""
    if p["engine"] == "vllm":
        return context - p["max_tokens"], f"model context {context} positions less max_tokens {p['max_tokens']} (engine vllm)"
    return context - 1, f"model context {context} positions less 1 to generate (engine torch)"
