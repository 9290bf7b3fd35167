"""Devices shared by declared memory shares: which device of its pool each replica lands on, and
the check that the shares declared on one device add up to at most 100%.

A node's `memory` (0 < memory <= 1) is the fraction of each of its devices' memory one replica
holds (on a cpu pool a slot stands for the host, and the share is of the host's memory). Replicas
take their pool's devices in data-flow order, `devices` consecutive slots each, wrapping around at
the pool's count (`assign_slots`; dora/runtime/placement.py places by this very function). So nodes
whose replicas x devices together exceed the count share devices: one GPU holds a generate replica
and the trainer. A declared pool may be shared so only when every node in it declares its share;
then the shares on each device must sum to at most 1. `dora validate` names the nodes (file:line)
of a device that is asked for more.
"""

from __future__ import annotations

from typing import Callable, Mapping

from dora.graph.diagnostics import Diagnostic, error
from dora.graph.model import Graph, Node
from dora.graph.printing import share_text

ROUNDING = 1e-9   # shares are decimals: 0.3 + 0.7 is not above 1


def assign_slots(graph: Graph, order: list[str], counts: Mapping[str, int],
                 pool_of: Callable[[Node], str]) -> dict[tuple[str, int], tuple[int, ...]]:
    """(node, replica) -> the pool-local device slots it holds: nodes in `order`, replicas in turn,
    `devices` consecutive slots each, wrapping around at the pool's count."""
    at: dict[str, int] = {}
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    for name in order:
        n = graph.nodes[name]
        pool = pool_of(n)
        for r in range(n.replicas):
            start = at.get(pool, 0)
            out[(name, r)] = tuple((start + i) % counts[pool] for i in range(n.devices))
            at[pool] = start + n.devices
    return out


def is_share(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def share_problems(g: Graph) -> list[Diagnostic]:
    """Bad `memory` values, shares on a node without a declared pool, and devices asked for more
    than 100% of their memory. (A pool oversubscribed by nodes that do not all declare a share is
    the pool check's error: dora/graph/validate.py.)"""
    diags = []
    for n, node in g.nodes.items():
        if node.memory is None:
            continue
        loc = g.loc_of(f"nodes.{n}.memory")
        if not is_share(node.memory):
            diags.append(error(f"memory must be a fraction of each device's memory, 0 < memory <= 1, got {node.memory!r}",
                               loc, node=n, hint="memory: 0.45 holds 45% of each of the replica's devices"))
        elif node.pool is None:
            diags.append(error("memory is a share of a pool's devices, but the node names no pool", loc, node=n,
                               hint="put it in a declared pool (pool: NAME) with the nodes it shares devices with"))
    for pool in shared_pools(g):
        if all(is_share(n.memory) for n in g.nodes.values() if n.pool == pool):
            diags += _over_full(g, pool)
    return diags


def shared_pools(g: Graph) -> list[str]:
    """Declared pools whose nodes need more devices than the pool has and all declare a memory
    share: their devices are shared."""
    out = []
    for name, pool in g.pools.items():
        users = [n for n in g.nodes.values() if n.pool == name]
        if not _is_count(pool.count) or not users or not all(
                _is_count(n.replicas) and _is_count(n.devices) and n.memory is not None for n in users):
            continue
        if sum(n.replicas * n.devices for n in users) > pool.count:
            out.append(name)
    return out


def _over_full(g: Graph, pool: str) -> list[Diagnostic]:
    order = [n for n in g.acyclic_prefix() if g.nodes[n].pool == pool]
    if len(order) != sum(1 for n in g.nodes.values() if n.pool == pool):
        return []    # a cycle: reported by the cycle check; the data-flow order is undefined
    on = device_users(g, pool, order)
    by_users: dict[tuple[str, ...], list[int]] = {}   # one error per set of nodes, listing its devices
    for s, users in sorted(on.items()):
        if sum(g.nodes[n].memory for n, _ in users) > 1 + ROUNDING:
            by_users.setdefault(tuple(dict.fromkeys(n for n, _ in users)), []).append(s)
    diags = []
    for names, devices in by_users.items():
        users = on[devices[0]]   # (one device: its replicas; several: the nodes whose replicas each holds)
        total = sum(g.nodes[n].memory for n, _ in users)
        one = len(devices) == 1
        who = " + ".join(f"{n}[{r}] {share_text(g.nodes[n].memory)} ({g.loc_of(f'nodes.{n}.memory')})" for n, r in users) \
            if one else " + ".join(f"{n} {share_text(g.nodes[n].memory)} ({g.loc_of(f'nodes.{n}.memory')})"
                                   for n, _ in users)
        where = f"device {devices[0]}" if one else f"devices {', '.join(map(str, devices))} each"
        diags.append(error(
            f"{g.pools[pool].device} pool {pool!r} {where} shared by {who} = {share_text(total)} of its memory, "
            "over 100%",
            g.loc_of(f"nodes.{names[0]}.memory"), node=names[0],
            hint=f"lower the memory shares of {', '.join(names)} to sum to at most 1, or raise pools.{pool}.count"))
    return diags


def device_users(g: Graph, pool: str, order: list[str]) -> dict[int, list[tuple[str, int]]]:
    """A pool's devices -> the (node, replica)s placed on each, nodes taken in `order`."""
    on: dict[int, list[tuple[str, int]]] = {}
    for (n, r), held in assign_slots(g, order, {pool: g.pools[pool].count}, lambda node: pool).items():
        for s in held:
            on.setdefault(s, []).append((n, r))
    return on
