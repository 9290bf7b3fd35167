"""Placement: which device (or CPU slot) each node replica runs on.

A pool is a set of `count` devices of one kind (gpu: device indices 0..count-1; cpu: CPU
slots). Replica r of a node in a pool gets slot r % count. Nodes that name the same pool are
colocated: they time-share its slots. Nodes in different pools are disaggregated. Nodes without
a pool go to an implicit cpu pool "default" with one slot per CPU core.

Per replica: gpu -> CUDA_VISIBLE_DEVICES=<index>, torch device "cuda:0" (the one visible);
cpu -> CUDA_VISIBLE_DEVICES="" and threads = slots / replicas sharing the pool (>= 1), which the
worker applies to torch and the backend exports as OMP_NUM_THREADS/MKL_NUM_THREADS.
"""

from __future__ import annotations

import dataclasses
import os

from dora.graph.model import Graph, Pool
from dora.runtime.errors import PlacementError

DEFAULT_POOL = "default"


@dataclasses.dataclass
class ReplicaPlacement:
    node: str
    replica: int
    pool: str
    kind: str            # cpu | gpu
    slot: int            # device index (gpu) or CPU slot (cpu) within the pool
    device: str          # torch device string inside the worker
    threads: int
    env: dict[str, str]
    endpoint: str | None = None   # the replica's inbox, known once it is running

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"


@dataclasses.dataclass
class Plan:
    pools: dict[str, Pool]
    replicas: list[ReplicaPlacement]
    edges: list[str] = dataclasses.field(default_factory=list)   # one line per data edge: routing and capacity

    def of(self, node: str) -> list[ReplicaPlacement]:
        return [r for r in self.replicas if r.node == node]

    def get(self, node: str, replica: int) -> ReplicaPlacement:
        return next(r for r in self.replicas if r.node == node and r.replica == replica)


def pools_of(graph: Graph) -> dict[str, Pool]:
    pools = dict(graph.pools)
    if any(n.pool is None for n in graph.nodes.values()) and DEFAULT_POOL not in pools:
        pools[DEFAULT_POOL] = Pool(DEFAULT_POOL, "cpu", max(1, os.cpu_count() or 1))
    return pools


def plan(graph: Graph) -> Plan:
    pools = pools_of(graph)
    sharing: dict[str, int] = {}
    for n in graph.nodes.values():
        pool = n.pool or DEFAULT_POOL
        if pool not in pools:
            raise PlacementError(f"node {n.name!r} names pool {pool!r}, which is not declared (pools: {sorted(pools)})")
        if pools[pool].device not in ("cpu", "gpu") or pools[pool].count < 1:
            raise PlacementError(f"pool {pool!r}: device must be cpu or gpu and count >= 1 (got {pools[pool].device!r}, {pools[pool].count})")
        if n.replicas < 1:
            raise PlacementError(f"node {n.name!r}: replicas must be >= 1 (got {n.replicas})")
        sharing[pool] = sharing.get(pool, 0) + n.replicas
    out: list[ReplicaPlacement] = []
    for name in graph.topo_order():
        n = graph.nodes[name]
        pool = pools[n.pool or DEFAULT_POOL]
        for r in range(n.replicas):
            slot = r % pool.count
            if pool.device == "gpu":
                threads = 1
                env = {"CUDA_VISIBLE_DEVICES": str(slot)}
                device = "cuda:0"
            else:
                threads = max(1, pool.count // sharing[pool.name])
                env = {"CUDA_VISIBLE_DEVICES": ""}
                device = "cpu"
            env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
            out.append(ReplicaPlacement(name, r, pool.name, pool.device, slot, device, threads, env))
    edges = []
    for e in graph.edges:
        src_n, dst_n = graph.nodes[e.src].replicas, graph.nodes[e.dst].replicas
        how = f"group_by {e.group_by}" if e.group_by else e.routing
        edges.append(f"{e.label}: {src_n} -> {dst_n} replica(s), {how}, capacity {e.capacity} batches / {e.capacity_bytes} bytes per producer replica")
    return Plan(pools, out, edges)


def endpoint_hint(backend: str, node: str, replica: int) -> str:
    """What a replica's inbox will be, before it binds (ports and folders are chosen at start)."""
    if backend == "local":
        from dora.runtime.backends.local import resolve_transport
        if resolve_transport() == "ipc":
            return f"ipc://<run's socket folder>/{node}-{replica}.sock"
        return "tcp://127.0.0.1:<random port>"
    return "tcp://<node address>:<random port>"


def format_plan(p: Plan, backend: str | None = None) -> str:
    """A readable table for `dora run --dry-run`."""
    lines = ["pools:"]
    for pool in p.pools.values():
        users = sorted({r.node for r in p.replicas if r.pool == pool.name})
        share = " (colocated, time-shared)" if len(users) > 1 else ""
        lines.append(f"  {pool.name}: {pool.count} x {pool.device}  nodes: {', '.join(users) or '-'}{share}")
    lines.append("replicas:")
    w = max((len(r.label) for r in p.replicas), default=4)
    for r in p.replicas:
        where = f"gpu {r.slot} (CUDA_VISIBLE_DEVICES={r.slot})" if r.kind == "gpu" else f"cpu slot {r.slot}, {r.threads} thread(s)"
        ep = r.endpoint or (endpoint_hint(backend, r.node, r.replica) if backend else "<bound at start>")
        lines.append(f"  {r.label:<{w}}  pool {r.pool:<10} {where:<38} device {r.device:<7} inbox {ep}")
    if p.edges:
        lines.append("edges:")
        lines.extend(f"  {e}" for e in p.edges)
    return "\n".join(lines)
