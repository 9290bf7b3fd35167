"""The settings half of `dora validate`: every problem with the settings as a run would use them
(the async and run sections, the mode's rules and group arithmetic, the model section, rules across
nodes). dora/graph/resolve.py computes the run's settings with the same helpers."""

from __future__ import annotations

from typing import Any

from dora.graph.diagnostics import Diagnostic, error, errors_of
from dora.graph.eval_check import eval_problems
from dora.graph.loggers import validate_loggers
from dora.graph.model import Graph
from dora.graph.opspec import OpSpec, fill_params, import_object, param_problems
from dora.graph.sections import ModeError, resolve_async, section_specs

TORCH_ENGINE_CHECK = "dora.ops.engines.paged:engine_problem"   # model -> why the torch engine cannot run it
ENGINES_THAT_SLEEP = ("torch",)   # generate engines that can hand their device's memory back (sleep / wake)
ENGINES_HOSTING_VERSIONS = ("torch",)   # generate engines whose replicas may host several policy versions at once


def nodes_with(specs: dict[str, OpSpec | None], op: str) -> list[str]:
    """The nodes whose op is `op` (a registry name), in graph order."""
    return [n for n, s in specs.items() if s is not None and s.name == op]


def group_size_of(graph: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> int | None:
    """The dataset nodes' group size (None without a dataset node)."""
    sizes = {params[n]["group_size"] for n in nodes_with(specs, "dataset") if n in params}
    return sizes.pop() if len(sizes) == 1 else None


def settings_problems(g: Graph, specs: dict[str, OpSpec | None]) -> list[Diagnostic]:
    """Every problem with the settings as a run would use them (nodes whose params are bad are
    reported by the param checks and left out here)."""
    diags: list[Diagnostic] = []
    for section, cfg in (("async", g.async_), ("run", g.run)):
        for key, ps in section_specs(type(cfg)).items():
            value, err = ps.check(getattr(cfg, key))
            if err:
                diags.append(error(f"{section}.{key} {err}", g.loc_of(f"{section}.{key}"), hint=ps.doc))
            elif ps.check_name(value):
                diags.append(error(f"{section}.{key}: {ps.check_name(value)}", g.loc_of(f"{section}.{key}"), hint=ps.doc))
    params = {n: fill_params(s, g.nodes[n].params, checked=True) for n, s in specs.items()
              if s is not None and isinstance(g.nodes[n].params, dict) and not param_problems(s, g.nodes[n].params)}
    datasets = [n for n in nodes_with(specs, "dataset") if n in params]
    sizes = {n: params[n]["group_size"] for n in datasets}
    if len(set(sizes.values())) > 1:
        diags.append(error(f"dataset nodes disagree on group_size ({', '.join(f'{n}: {v}' for n, v in sizes.items())}): "
                           "a run has one group size", g.loc_of(f"nodes.{datasets[1]}.params.group_size")))
    elif not errors_of(diags):
        try:
            resolve_async(g.async_, next(iter(sizes.values()), None))
        except ModeError as e:
            where = (f"nodes.{datasets[0]}.params.group_size" if e.key == "group_size" and datasets
                     else f"async.{e.key}" if e.key != "group_size" else "async")
            diags.append(error(f"async: {e}", g.loc_of(where)))
    diags += validate_loggers(g)
    diags += _model_problems(g)
    diags += _broadcast_problems(g, specs, params)
    diags += _elastic_problems(g, specs, params)
    diags += _engine_problems(g, specs, params)
    diags += eval_problems(g, specs, params)
    return diags


def _engine_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """A generate node's engine must be able to run the pipeline's model (architecture, head sizes)."""
    if not isinstance(g.model, dict):
        return []
    problem = None
    diags = []
    for name in nodes_with(specs, "generate"):
        if params.get(name, {}).get("engine") != "torch":
            continue
        if problem is None:
            problem = import_object(TORCH_ENGINE_CHECK)(g.model) or ""
        if problem:
            diags.append(error(f"engine torch cannot run this model: {problem}", g.loc_of(f"nodes.{name}.params.engine"),
                               node=name, hint="use a llama or qwen2 model the engine supports, or engine: vllm"))
    return diags


def _elastic_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """async.elastic lends the trainer's own devices to rollout: there must be a trainer with devices of
    its own, and a generate engine that can hand its memory back (sleep)."""
    if g.async_.elastic is not True:
        return []
    at = g.loc_of("async.elastic")
    gens, ups = nodes_with(specs, "generate"), nodes_with(specs, "update")
    if len(gens) != 1 or len(ups) != 1:
        return [error(f"async.elastic needs an RL graph with one generate and one update node (found {len(gens)} "
                      f"generate, {len(ups)} update): there are no trainer devices to lend", at)]
    gen, up = g.nodes[gens[0]], g.nodes[ups[0]]
    diags = []
    if (gen.pool or None) == (up.pool or None):
        where = f"pool {up.pool!r}" if up.pool else "the default cpu pool"
        diags.append(error(f"async.elastic: {up.name!r} and {gen.name!r} share {where}: the trainer has no devices "
                           "of its own to lend (it already time-shares the rollout's)", at,
                           hint=f"give {up.name!r} its own pool, or remove async.elastic"))
    pool = g.pools.get(up.pool) if up.pool else None
    if pool is not None and pool.device == "gpu" and up.replicas * up.devices < gen.devices:
        diags.append(error(f"async.elastic: {up.name!r} holds {up.replicas * up.devices} GPU(s), fewer than one "
                           f"{gen.name!r} replica needs ({gen.devices}): nothing to lend", at))
    if params.get(gen.name, {}).get("engine", "torch") not in ENGINES_THAT_SLEEP:
        diags.append(error(f"async.elastic needs a generate engine that can release its memory (sleep); engine vllm "
                           "cannot here (vLLM's sleep mode is CUDA/ROCm/XPU only, and dora's vllm engine does not "
                           "drive it)", g.loc_of(f"nodes.{gen.name}.params.engine"), node=gen.name,
                           hint="use engine: torch, or remove async.elastic"))
    return diags


def _model_problems(g: Graph) -> list[Diagnostic]:
    if not isinstance(g.model, dict):
        return [error(f"'model' must be a mapping, got {type(g.model).__name__}", g.loc_of("model"))]
    check = import_object("dora.ops.models:model_problems")
    return [error(msg if msg.startswith("model") else f"model: {msg}", g.loc_of(f"model.{key}" if key else "model"))
            for key, msg in check(g.model)]


def _broadcast_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """A broadcast has two ends: the trainer sends to every generate replica its weights edge feeds."""
    diags = []
    for w in g.weights:
        if w.src not in params or w.dst not in params or "weight_sync" not in params[w.src]:
            continue
        up, gen = params[w.src], params[w.dst]
        if up["weight_sync"] != gen.get("weight_sync", "file"):
            diags.append(error(
                f"weight_sync differs across the weights edge {w.src} -> {w.dst}: {up['weight_sync']!r} on the "
                f"trainer, {gen.get('weight_sync')!r} on the generate node; both ends must use the same",
                g.loc_of(f"nodes.{w.src}.params.weight_sync"), node=w.src))
        elif up["weight_sync"] == "broadcast" and up["broadcast_to"] not in (0, g.nodes[w.dst].replicas):
            diags.append(error(
                f"broadcast_to {up['broadcast_to']} but {w.dst!r} has {g.nodes[w.dst].replicas} replicas",
                g.loc_of(f"nodes.{w.src}.params.broadcast_to"), node=w.src, hint="leave it at 0 (= the replica count)"))
    return diags
