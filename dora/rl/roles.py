"""Which nodes of a graph play which part in an RL run (a graph without them runs as plain dataflow),
for each policy of a graph with several (dora/graph/policies.py)."""

from __future__ import annotations

import dataclasses

from dora.graph.model import Graph


@dataclasses.dataclass
class RLRoles:
    dataset: str
    generate: str
    update: str
    trainer_feed: str          # the node whose output feeds the update node

    @staticmethod
    def find(graph: Graph, op_of) -> "RLRoles | None":
        """op_of(node) -> registered op name. None when the graph is not an RL graph (plain dataflow)."""
        gens = [n for n in graph.nodes if op_of(n) == "generate"]
        ups = [n for n in graph.nodes if op_of(n) == "update"]
        if len(gens) != 1 or len(ups) != 1:
            return None
        gen, up = gens[0], ups[0]
        feeds = graph.producers(gen)
        if len(feeds) != 1 or op_of(feeds[0].src) != "dataset":
            return None
        up_feeds = graph.producers(up)
        if len(up_feeds) != 1:
            return None
        return RLRoles(feeds[0].src, gen, up, up_feeds[0].src)

    @staticmethod
    def of_policies(resolved) -> "dict[str, RLRoles] | None":
        """update node -> its policy's roles, for a graph with several update nodes (validation made
        sure each is one prompt source -> one generate node, one feed -> the update node); None for
        a single-policy graph."""
        if not resolved.policies:
            return None
        from dora.graph.policies import find_policies
        return {p.update: RLRoles(p.prompt_source, p.generate, p.update, p.trainer_feed)
                for p in find_policies(resolved.graph, resolved.specs)}
