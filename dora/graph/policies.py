"""Several trainable policies in one graph: which nodes make up each policy, the checks a graph with
several update nodes must pass, and the settings each policy runs with.

A policy is one update node U, the generate node its weights edge serves, that node's prompt source
(the node feeding its `prompts` port: a dataset, or a `to_prompts` node turning another policy's
trajectories into prompt rows) and its scoring path (the nodes a row of U's generate node passes on
its way to U without going through another generate node). See docs/architecture.md, "Several
policies". A graph with one update node is a single-policy graph: nothing here changes how it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.diagnostics import Diagnostic, error
from dora.graph.model import Graph
from dora.graph.opspec import OpSpec, did_you_mean, import_object
from dora.graph.policy_roles import Policy, find_policies, is_multi_policy, node_policies, policy_dir, update_nodes

__all__ = ["Policy", "find_policies", "is_multi_policy", "node_policies", "policy_dir", "update_nodes",
           "policy_problems", "policy_settings"]

PROMPT_COLUMNS = ("uid", "group_id", "prompt_ids")   # what a run's prompt feed reads from a prompt row
ARCHITECTURE_OF = "dora.ops.model_section:architecture_of"   # model section -> its architecture (or None: unknown)
POLICY_KEYS = ("mode", "max_staleness", "rollout_batch", "train_batch", "versions_per_instance")


# ---------------------------------------------------------------- checks (dora validate)

def policy_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """A generate node fed by two update nodes, weights edges between different architectures, the
    `async.policies` entries, and (with several update nodes) policies a run cannot drive."""
    diags = _served_twice(g, specs) + _architecture_problems(g, specs) + _entry_problems(g, specs)
    if is_multi_policy(specs):
        diags += _drivable_problems(g, specs, params)
    return diags


def _served_twice(g: Graph, specs: dict[str, OpSpec | None]) -> list[Diagnostic]:
    first: dict[str, tuple[str, Any]] = {}
    diags = []
    for i, w in enumerate(g.weights):
        if w.dst not in g.nodes or w.src not in g.nodes or not (specs.get(w.src) and specs[w.src].is_update):
            continue
        seen = first.setdefault(w.dst, (w.src, w.loc if w.loc.file is not None else g.loc_of(f"weights.{i}")))
        if seen[0] != w.src:
            diags.append(error(
                f"generate node {w.dst!r} is fed weights by two update nodes, {seen[0]!r} ({seen[1]}) and {w.src!r}: "
                "a generate node samples from one policy", w.loc if w.loc.file is not None else g.loc_of(f"weights.{i}"),
                edge=f"weights {w.src} -> {w.dst}",
                hint=f"give {w.src!r} a generate node of its own (a policy may start from the same base model)"))
    return diags


def _architecture_problems(g: Graph, specs: dict[str, OpSpec | None]) -> list[Diagnostic]:
    """The trainer's weights are loaded into the generate node's model in place: same architecture,
    same vocabulary. Compared only where the two ends' model sections differ (a model's config is read
    only then)."""
    diags = []
    for i, w in enumerate(g.weights):
        if w.src not in g.nodes or w.dst not in g.nodes:
            continue
        a, b = g.model_of(w.src), g.model_of(w.dst)
        if a == b or not isinstance(a, dict) or not isinstance(b, dict):
            continue
        try:
            arch_a, arch_b = import_object(ARCHITECTURE_OF)(a), import_object(ARCHITECTURE_OF)(b)
        except Exception:   # a model section that cannot be read: the model checks name it
            continue
        if arch_a is None or arch_b is None:
            continue
        differ = [k for k in arch_a if arch_a[k] != arch_b.get(k)]
        if differ:
            what = ", ".join(f"{k} {arch_a[k]!r} vs {arch_b.get(k)!r}" for k in differ)
            kind = "vocabularies" if differ == ["vocab_size"] else "architectures"
            diags.append(error(
                f"weights edge {w.src} -> {w.dst} joins models of different {kind} ({what}): the trainer's "
                "weights are loaded into the generate node's model as they are",
                w.loc if w.loc.file is not None else g.loc_of(f"weights.{i}"), edge=f"weights {w.src} -> {w.dst}",
                hint=f"give {w.src!r} and {w.dst!r} the same model (a node's `model:` overrides the pipeline's)"))
    return diags


def _entry_problems(g: Graph, specs: dict[str, OpSpec | None]) -> list[Diagnostic]:
    from dora.graph.model import AsyncConfig
    from dora.graph.sections import section_specs

    entries = g.async_.policies
    if not isinstance(entries, dict):
        return []   # (the section check says it must be a mapping)
    ups = update_nodes(specs)
    declared = section_specs(AsyncConfig)
    diags = []
    for u, over in entries.items():
        where = f"async.policies.{u}"
        if u not in ups:
            what = f"op {specs[u].name!r}" if specs.get(u) is not None else "not a node" if u not in g.nodes else "a node"
            hint = did_you_mean(str(u), ups) or f"update nodes: {', '.join(ups) or 'none'}"
            diags.append(error(f"async.policies names {u!r}, which is not an update node ({what})", g.loc_of(where),
                               hint=hint))
            continue
        if not isinstance(over, dict):
            diags.append(error(f"async.policies.{u} must be a mapping of settings, got {over!r}", g.loc_of(where),
                               hint=f"e.g. {{max_staleness: 1}}; settings: {', '.join(POLICY_KEYS)}"))
            continue
        for key, value in over.items():
            if key not in POLICY_KEYS:
                hint = did_you_mean(str(key), POLICY_KEYS) or f"per-policy settings: {', '.join(POLICY_KEYS)}"
                diags.append(error(f"async.policies.{u}: unknown setting {key!r}", g.loc_of(f"{where}.{key}"), hint=hint))
                continue
            _, err = declared[key].check(value)
            if err:
                diags.append(error(f"async.policies.{u}.{key} {err}", g.loc_of(f"{where}.{key}"), hint=declared[key].doc))
    return diags


def _drivable_problems(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]]) -> list[Diagnostic]:
    """What a run needs of each policy of a multi-policy graph."""
    from dora.graph.schema import propagate

    diags = []
    schemas = None
    for p in find_policies(g, specs):
        u = g.nodes[p.update]
        if len(p.generates) != 1:
            diags.append(error(
                f"update node {p.update!r} serves {len(p.generates)} generate nodes ({', '.join(p.generates) or 'none'}): "
                "in a graph with several policies each update node feeds weights to exactly one generate node",
                u.loc, node=p.update, hint=f"weights: [{{from: {p.update}, to: GENERATE_NODE}}]"))
            continue
        if p.trainer_feed is None:
            diags.append(error(f"update node {p.update!r} must take its batches from exactly one node", u.loc,
                               node=p.update))
        gen = g.nodes[p.generate]
        if p.prompt_source is None:
            continue   # (generate's `prompts` port: the input checks name a missing or extra input)
        schemas = schemas or propagate(g, specs)
        edge = next(iter(gen.inputs.values()))
        cols = schemas.on_edge(edge)
        missing = [c for c in PROMPT_COLUMNS if cols is not None and c not in cols]
        if missing:
            diags.append(error(
                f"policy {p.update!r} takes its prompts from {p.prompt_source!r}, whose rows lack {missing}: a run "
                "dispatches prompt rows in groups by uid and group_id", g.loc_of(f"nodes.{p.generate}.inputs"),
                node=p.generate, hint="feed it from a dataset, or from a to_prompts node (another policy's trajectories)"))
    return diags


# ---------------------------------------------------------------- the settings each policy runs with

def overrides_of(g: Graph, update: str) -> dict[str, Any]:
    entries = g.async_.policies if isinstance(g.async_.policies, dict) else {}
    over = entries.get(update)
    return {k: v for k, v in over.items() if k in POLICY_KEYS} if isinstance(over, dict) else {}


def group_size_of_policy(p: Policy, params: dict[str, dict[str, Any]], fallback: int | None) -> int | None:
    """A policy's G: its prompt source's group_size (a dataset's, a to_prompts node's)."""
    src = params.get(p.prompt_source or "", {})
    return src["group_size"] if "group_size" in src else fallback


class PolicyModeError(ValueError):
    """A policy's merged async settings that its mode cannot run: which policy, which setting."""

    def __init__(self, update: str, key: str, overridden: bool, message: str):
        self.update, self.key, self.overridden = update, key, overridden
        super().__init__(message)


def policy_settings(g: Graph, specs: dict[str, OpSpec | None], params: dict[str, dict[str, Any]],
                    fallback_group: int | None) -> dict[str, Any]:
    """update node -> its AsyncSettings: the shared `async:` section with the policy's overrides, the
    mode's rules applied, its own group size; `policy` names it in a multi-policy graph. PolicyModeError
    for the first policy whose settings its mode refuses."""
    from dora.graph.sections import ModeError, resolve_async

    multi = is_multi_policy(specs)
    out = {}
    for p in find_policies(g, specs):
        over = overrides_of(g, p.update)
        cfg = dataclasses.replace(g.async_, **over)
        try:
            a = resolve_async(cfg, group_size_of_policy(p, params, fallback_group) if multi else fallback_group)
        except ModeError as e:
            raise PolicyModeError(p.update, e.key, e.key in over, f"policy {p.update!r}: {e}" if multi else str(e)) from None
        out[p.update] = dataclasses.replace(a, policy=p.update) if multi else a
    return out


def _generate_upstream(g: Graph, node: str, port: str, gens: set[str]) -> str | None:
    """The first generate node met walking up from `node`'s input `port` (None: none)."""
    edge = g.nodes[node].inputs.get(port)
    todo, seen = ([edge.src] if edge is not None else []), set()
    while todo:
        n = todo.pop(0)
        if n in gens:
            return n
        if n in seen or n not in g.nodes:
            continue
        seen.add(n)
        todo += [e.src for e in g.nodes[n].inputs.values()]
    return None


def derive_cross_policy(g: Graph, specs: dict[str, OpSpec], params: dict[str, dict[str, Any]],
                        policies: list[Policy], settings: dict[str, Any]) -> None:
    """Params of the ops that join policies, left null, from the policies they join: to_prompts'
    version_column and frontier's version_column and answers (the answering policy's group size)."""
    gens = {n for n, s in specs.items() if s.is_generate}
    owner = {p.generate: p.update for p in policies if p.generate}
    for n, spec in specs.items():
        port = {"to_prompts": "trajectories", "frontier": "solved"}.get(spec.name)
        if port is None:
            continue
        u = owner.get(_generate_upstream(g, n, port, gens))
        if u is None:
            continue
        if params[n]["version_column"] is None:
            params[n]["version_column"] = f"{u}_version"
        if spec.name == "frontier" and params[n]["answers"] is None:
            params[n]["answers"] = settings[u].group_size
