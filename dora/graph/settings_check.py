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
from dora.graph.policies import PolicyModeError, find_policies, is_multi_policy, policy_problems, policy_settings
from dora.graph.prompt_limits import limit_problems
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
    diags += policy_problems(g, specs, params)
    if is_multi_policy(specs) or g.async_.policies:
        if not errors_of(diags):   # each policy's mode rules and group arithmetic (its own group size)
            diags += _policy_mode_problems(g, specs, params, datasets)
    elif len(set(sizes.values())) > 1:
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
    diags += _fast_lane_problems(g, specs)
    diags += limit_problems(g, specs, params)   # the dataset's prompt limit, and a file source's first rows
    diags += eval_problems(g, specs, params)
    return diags


def _fast_lane_problems(g: Graph, specs: dict[str, OpSpec | None]) -> list[Diagnostic]:
    """async.fast_lanes must leave the newest version at least one generate replica."""
    lanes = g.async_.fast_lanes
    counts = [g.nodes[n].replicas for n in nodes_with(specs, "generate")]
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in counts):
        return []   # (a replicas that is not a count is its node's own error)
    replicas = sum(counts)
    if not isinstance(lanes, int) or lanes < 1 or not replicas or lanes < replicas:
        return []
    return [error(f"async.fast_lanes {lanes} leaves no generate replica for the newest version: the pipeline has "
                  f"{replicas} generate replica(s), and fast lanes may take at most {replicas - 1}",
                  g.loc_of("async.fast_lanes"), hint=f"use async.fast_lanes <= {replicas - 1}, -1 (as measured) or 0 (none)")]


def _policy_mode_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]],
                          datasets: list[str]) -> list[Diagnostic]:
    sizes = {params[n]["group_size"] for n in datasets}
    try:
        policy_settings(g, specs, params, sizes.pop() if len(sizes) == 1 else None)
    except PolicyModeError as e:
        if e.overridden:
            where = f"async.policies.{e.update}.{e.key}"
        elif e.key == "group_size":
            src = next((p.prompt_source for p in find_policies(g, specs) if p.update == e.update), None)
            where = f"nodes.{src}.params.group_size" if src else "async"
        else:
            where = f"async.{e.key}"
        return [error(f"async: {e}", g.loc_of(where))]
    return []


def _engine_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """A generate node's engine must be able to run the pipeline's model (architecture, head sizes)."""
    if not isinstance(g.model, dict):
        return []
    problems: dict[str, str] = {}   # (one check per distinct model section)
    diags = []
    for name in nodes_with(specs, "generate"):
        if params.get(name, {}).get("engine") != "torch" or not isinstance(g.model_of(name), dict):
            continue
        model = g.model_of(name)
        key = repr(sorted(model.items()))
        if key not in problems:
            problems[key] = import_object(TORCH_ENGINE_CHECK)(model) or ""
        problem = problems[key]
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
    if is_multi_policy(specs):   # each policy lends its own trainer's devices to its own generate node
        pairs = [(p.generate, p.update) for p in find_policies(g, specs) if p.generate is not None]
        return [d for gen, up in pairs for d in _elastic_pair(g, params, gen, up, at)]
    if len(gens) != 1 or len(ups) != 1:
        return [error(f"async.elastic needs an RL graph with one generate and one update node (found {len(gens)} "
                      f"generate, {len(ups)} update): there are no trainer devices to lend", at)]
    return _elastic_pair(g, params, gens[0], ups[0], at)


def _elastic_pair(g: Graph, params: dict[str, dict[str, Any]], gen_name: str, up_name: str, at) -> list[Diagnostic]:
    """What elastic lending needs of one trainer and the generate node it serves."""
    gen, up = g.nodes[gen_name], g.nodes[up_name]
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
    """The pipeline's `model:` section, and each node's own (merged over it; a problem is placed on the
    node's line when the node's keys are where it is)."""
    if not isinstance(g.model, dict):
        return [error(f"'model' must be a mapping, got {type(g.model).__name__}", g.loc_of("model"))]
    check = import_object("dora.ops.model_section:model_problems")
    diags = [error(msg if msg.startswith("model") else f"model: {msg}", g.loc_of(f"model.{key}" if key else "model"))
             for key, msg in check(g.model)]
    for name, node in g.nodes.items():
        if node.model is None:
            continue
        if not isinstance(node.model, dict):
            diags.append(error(f"a node's model must be a mapping (merged over the pipeline's model section), got "
                               f"{type(node.model).__name__}", g.loc_of(f"nodes.{name}.model"), node=name))
            continue
        for key, msg in check(g.model_of(name)):
            own = f"nodes.{name}.model.{key}" if key in node.model else f"nodes.{name}.model"
            diags.append(error(msg if msg.startswith("model") else f"model: {msg}", g.loc_of(own), node=name))
    return diags


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
