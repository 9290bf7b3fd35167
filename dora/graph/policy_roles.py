"""Which nodes make up each policy of a graph (navigation only; the checks and settings are in
dora/graph/policies.py, which explains what a policy is). Duck-typed on the Graph, so printing can
use it without an import circle."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

POLICIES_DIR = "policies"


@dataclasses.dataclass(frozen=True)
class Policy:
    update: str
    generates: tuple[str, ...]          # served by U's weights edges (a run drives exactly one)
    prompt_source: str | None           # the node feeding the generate node's prompts (None: not exactly one)
    trainer_feed: str | None            # the node feeding U (None: not exactly one)
    scoring: tuple[str, ...]            # generate -> U without crossing another generate node
    exposed: tuple[str, ...]            # every node on a data path generate -> ... -> U (through other policies too)

    @property
    def generate(self) -> str | None:
        return self.generates[0] if len(self.generates) == 1 else None


def policy_dir(run_dir: str, update: str) -> str:
    """RUN_DIR/policies/<update>: one policy's own files in a multi-policy run (trained.jsonl,
    checkpoints/step_N, its weight versions)."""
    return os.path.join(run_dir, POLICIES_DIR, update)


def update_nodes(specs: dict[str, Any]) -> list[str]:
    return [n for n, s in specs.items() if s is not None and s.is_update]


def is_multi_policy(specs: dict[str, Any]) -> bool:
    return len(update_nodes(specs)) >= 2


def _reach(g: Any, start: str, stop: set[str], up: bool = False) -> set[str]:
    """Nodes reachable from `start` by data edges (against them with `up`), not going past nodes in
    `stop` (they are left out)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for other in ([e.src for e in g.producers(n)] if up else [e.dst for e in g.consumers(n)]):
            if other in g.nodes and other not in seen and other not in stop:
                seen.add(other)
                todo.append(other)
    return seen


def _downstream(g: Any, start: str, stop: set[str]) -> set[str]:
    return _reach(g, start, stop)


def _upstream(g: Any, start: str, stop: set[str]) -> set[str]:
    return _reach(g, start, stop, up=True)


def find_policies(g: Any, specs: dict[str, Any]) -> list[Policy]:
    """Every update node's policy, in graph order."""
    gens = {n for n, s in specs.items() if s is not None and s.is_generate}
    out = []
    for u in update_nodes(specs):
        served = tuple(dict.fromkeys(w.dst for w in g.weights if w.src == u and w.dst in gens))
        gen = served[0] if len(served) == 1 else None
        feeds = [e.src for e in g.nodes[gen].inputs.values()] if gen else []
        up_feeds = list(dict.fromkeys(e.src for e in g.nodes[u].inputs.values()))
        scoring: tuple[str, ...] = ()
        exposed: tuple[str, ...] = ()
        if gen is not None:
            mine = _downstream(g, gen, gens) & (_upstream(g, u, gens) | {u})
            scoring = tuple(n for n in g.nodes if n in mine and n != u)
            every = _downstream(g, gen, set()) & _upstream(g, u, set())
            exposed = tuple(n for n in g.nodes if n in every and n != gen)
        out.append(Policy(u, served, feeds[0] if len(feeds) == 1 else None,
                          up_feeds[0] if len(up_feeds) == 1 else None, scoring, exposed))
    return out


def node_policies(g: Any, policies: list[Policy]) -> dict[str, str]:
    """node -> the update node of the policy it belongs to (its update node, generate node, prompt
    source, scoring path; a node in several policies belongs to the first). Nodes of no policy are absent."""
    out: dict[str, str] = {}
    for p in policies:
        for n in (p.update, *p.generates, p.prompt_source, *p.scoring):
            if n is not None and n in g.nodes:
                out.setdefault(n, p.update)
    return out


def feeders(g: Any, policies: list[Policy]) -> dict[str, set[str]]:
    """update node -> the policies whose trajectories it takes (their generate output reaches its
    prompt source or its update node): a policy that finished keeps rolling out while one of these
    still trains."""
    out: dict[str, set[str]] = {p.update: set() for p in policies}
    for p in policies:
        for q in policies:
            if q is p or q.generate is None:
                continue
            reach = _downstream(g, q.generate, set())
            if p.update in reach or (p.prompt_source is not None and (p.prompt_source in reach or p.prompt_source == q.generate)):
                out[p.update].add(q.update)
    return out


def prompt_feeders(g: Any, policies: list[Policy]) -> dict[str, set[str]]:
    """update node -> the policies whose trajectories become its prompts (their generate output
    reaches its prompt source): when they make no more, its prompts run out."""
    out: dict[str, set[str]] = {p.update: set() for p in policies}
    for p in policies:
        for q in policies:
            if q is not p and q.generate is not None and p.prompt_source is not None and (
                    p.prompt_source == q.generate or p.prompt_source in _downstream(g, q.generate, set())):
                out[p.update].add(q.update)
    return out
