"""Resolution: a valid Graph -> the settings a run uses, computed once.

`resolve(graph)` computes what the run hands out: every node's params filled and derived,
AsyncSettings, RunConfig. It validates first (dora/graph/validate.py, whose settings half is
dora/graph/settings_check.py, the same code), so whatever validation accepts, resolution accepts.

Derived params (the one place they are derived):
- `temperature: null` on update / reference takes the generate node's sampling temperature (a
  greedy 0 counts as 1, the temperature its logprobs are reported at), so importance ratios
  compare like with like;
- `broadcast_to: 0` on an update with `weight_sync: broadcast` becomes the generate replica count;
- `max_prompt_tokens: null` on a dataset becomes the longest prompt the generate nodes it feeds take,
  when the model's context is known (dora/graph/prompt_limits.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.diagnostics import GraphError, errors_of
from dora.graph.eval_check import resolve_evals
from dora.graph.model import Graph, RunConfig
from dora.graph.opspec import OpSpec, fill_params
from dora.graph.policies import derive_cross_policy, find_policies, is_multi_policy, node_policies, policy_settings
from dora.graph.prompt_limits import derive as _derive_prompt_limits
from dora.graph.schema import resolve_all
from dora.graph.sections import AsyncSettings, resolve_async
from dora.graph.settings_check import ENGINES_HOSTING_VERSIONS, group_size_of, nodes_with
from dora.graph.validate import validate


@dataclasses.dataclass
class Resolved:
    """What a run of a valid graph uses."""

    graph: Graph
    specs: dict[str, OpSpec]
    params: dict[str, dict[str, Any]]    # node -> every declared param, checked, typed, derived
    async_: AsyncSettings
    run: RunConfig
    evals: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)   # held-out sets, nulls filled
    # a graph with several update nodes (dora/graph/policies.py): each policy's settings, and the policy
    # of each node that belongs to one; a single-policy graph has none and every node gets async_
    policies: dict[str, AsyncSettings] = dataclasses.field(default_factory=dict)
    node_policy: dict[str, str] = dataclasses.field(default_factory=dict)

    def op_of(self, node: str) -> str:
        return self.specs[node].name

    def async_of(self, node: str) -> AsyncSettings:
        """The async settings node `node`'s workers get: its policy's, else the run's."""
        u = self.node_policy.get(node)
        return self.policies[u] if u is not None else self.async_


def resolve(g: Graph) -> Resolved:
    """The settings a run of `g` uses; GraphError if `g` is not valid (run `validate` first for
    every diagnostic with its location)."""
    diags = validate(g)
    if errors_of(diags):
        raise GraphError(diags)
    specs: dict[str, OpSpec] = {n: s for n, s in _specs(g).items()}
    params = {n: fill_params(specs[n], node.params, checked=True) for n, node in g.nodes.items()}
    _derive_temperature(specs, params)
    _derive_broadcast_world(g, specs, params)
    _derive_prompt_limits(g, specs, params)
    if not is_multi_policy(specs) and not g.async_.policies:
        async_ = resolve_async(g.async_, group_size_of(g, specs, params))
        async_ = dataclasses.replace(async_, versions_per_instance=versions_per_instance(async_, specs, params))
        return Resolved(g, specs, params, async_, dataclasses.replace(g.run), resolve_evals(g, specs, params))
    policies = find_policies(g, specs)
    settings = policy_settings(g, specs, params, group_size_of(g, specs, params))
    for p in policies:   # M from the engines of the policy's own generate node
        own = {n: s for n, s in specs.items() if n in p.generates}
        settings[p.update] = dataclasses.replace(
            settings[p.update], versions_per_instance=versions_per_instance(settings[p.update], own, params))
    multi = is_multi_policy(specs)
    if multi:
        derive_cross_policy(g, specs, params, policies, settings)
    return Resolved(g, specs, params, settings[policies[0].update], dataclasses.replace(g.run),
                    policies=settings if multi else {}, node_policy=node_policies(g, policies) if multi else {})


def versions_per_instance(a: AsyncSettings, specs: dict[str, OpSpec], params: dict[str, dict[str, Any]]) -> int:
    """M as the run uses it: async.versions_per_instance where every generate node's engine can host
    several versions on a replica (ENGINES_HOSTING_VERSIONS), else 1 (vllm replicas hold one set of
    weights: a pipeline on vllm runs with one version per instance rather than being refused)."""
    engines = {params[n].get("engine") for n in nodes_with(specs, "generate")}
    return a.versions_per_instance if engines <= set(ENGINES_HOSTING_VERSIONS) else 1


def _specs(g: Graph) -> dict[str, OpSpec]:
    specs, _ = resolve_all(g)
    return {n: s for n, s in specs.items() if s is not None}


def _derive_temperature(specs: dict[str, OpSpec], params: dict[str, dict[str, Any]]) -> None:
    gens = {params[n]["temperature"] for n in nodes_with(specs, "generate")}
    t = gens.pop() if len(gens) == 1 else 1.0
    t = t if t > 0 else 1.0   # greedy decoding reports logprobs at T = 1
    for n, p in params.items():
        if specs[n].name != "generate" and "temperature" in specs[n].params and p["temperature"] is None:
            p["temperature"] = t


def _derive_broadcast_world(g: Graph, specs: dict[str, OpSpec], params: dict[str, dict[str, Any]]) -> None:
    for w in g.weights:
        p = params[w.src]
        if p.get("weight_sync") == "broadcast" and p["broadcast_to"] == 0:
            p["broadcast_to"] = g.nodes[w.dst].replicas

