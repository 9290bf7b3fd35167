"""The pipeline model: the one Graph object that YAML, the Python builder and the visualizer share.

Plain dataclasses, no behaviour beyond navigation: loading lives in yaml_io, checking in
validate, drawing in viz. The runtime consumes exactly these attributes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ROUTINGS = ("round_robin", "least_loaded")  # plus "hash:COLUMN"
ASYNC_MODES = ("sync", "one_step_off", "partial", "dora")


@dataclasses.dataclass
class SourceLoc:
    """Where a YAML value came from, so errors can say file:line."""

    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.file is None:
            return "<python>"
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclasses.dataclass
class Pool:
    name: str
    device: str = "cpu"          # cpu | gpu
    count: int = 1               # devices (gpu) or CPU slots (cpu)
    loc: SourceLoc = dataclasses.field(default_factory=SourceLoc, compare=False)


@dataclasses.dataclass
class Edge:
    """A data edge: src/src_port -> dst/dst_port, with delivery options."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    group_by: str | None = None      # deliver whole groups keyed by this column to one replica
    capacity: int = 8                # credits: batches in flight on this edge
    capacity_bytes: int = 64 << 20   # and bytes in flight
    routing: str = "round_robin"     # round_robin | least_loaded | hash:COLUMN
    loc: SourceLoc = dataclasses.field(default_factory=SourceLoc, compare=False)

    @property
    def label(self) -> str:
        return f"{self.src}/{self.src_port} -> {self.dst}.{self.dst_port}"


@dataclasses.dataclass
class WeightsEdge:
    """update -> generate: the one feedback edge; carries versioned weights, not data."""

    src: str
    dst: str
    loc: SourceLoc = dataclasses.field(default_factory=SourceLoc, compare=False)


@dataclasses.dataclass
class Node:
    name: str
    op: str                                   # registry name or "pkg.module:Class"
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # as written (no defaults)
    pool: str | None = None
    replicas: int = 1
    inputs: dict[str, Edge] = dataclasses.field(default_factory=dict)  # dst_port -> edge
    loc: SourceLoc = dataclasses.field(default_factory=SourceLoc, compare=False)


@dataclasses.dataclass
class AsyncConfig:
    mode: str = "sync"
    max_staleness: int = 1       # K
    rollout_batch: int = 32      # RBS: prompts-worth of trajectories dispatched per step
    train_batch: int = 32        # TBS: trajectories consumed per training step
    elastic: bool = False        # trainer devices waiting for a batch serve rollout (simulator only so far)
    loc: SourceLoc = dataclasses.field(default_factory=SourceLoc, compare=False)


@dataclasses.dataclass
class Graph:
    name: str
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)       # insertion-ordered
    pools: dict[str, Pool] = dataclasses.field(default_factory=dict)
    weights: list[WeightsEdge] = dataclasses.field(default_factory=list)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    async_: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)        # other top-level sections kept for round-trip (e.g. run:)
    source_file: str | None = dataclasses.field(default=None, compare=False)  # where it was loaded from (metadata, like loc)
    # Where each dotted YAML path came from ("nodes.rollout.params.temperature" -> file:line),
    # so that checks on a built Graph can still point at the line. Empty for Python-built graphs.
    locs: dict[str, SourceLoc] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def loc_of(self, path: str) -> SourceLoc:
        """The location of the most specific recorded prefix of a dotted path."""
        parts = path.split(".")
        while parts:
            loc = self.locs.get(".".join(parts))
            if loc is not None:
                return loc
            parts.pop()
        return SourceLoc(self.source_file, None)

    @property
    def edges(self) -> list[Edge]:
        return [e for n in self.nodes.values() for e in n.inputs.values()]

    def consumers(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node]

    def producers(self, node: str) -> list[Edge]:
        return list(self.nodes[node].inputs.values())

    def sources(self) -> list[str]:
        return [n for n, node in self.nodes.items() if not node.inputs]

    def acyclic_prefix(self) -> list[str]:
        """Nodes in topological order (Kahn's algorithm, ties by declaration order), leaving out
        those on or behind a cycle; edges from unknown nodes are ignored. Never raises."""
        indeg = {n: len({e.src for e in node.inputs.values() if e.src in self.nodes}) for n, node in self.nodes.items()}
        ready = [n for n, d in indeg.items() if d == 0]
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for dst in dict.fromkeys(e.dst for e in self.consumers(n)):
                indeg[dst] -= 1
                if indeg[dst] == 0:
                    ready.append(dst)
        return order

    def topo_order(self) -> list[str]:
        """Nodes in data-edge topological order (ties broken by declaration order)."""
        order = self.acyclic_prefix()
        if len(order) != len(self.nodes):
            raise ValueError("data edges form a cycle; run validation for details")
        return order
