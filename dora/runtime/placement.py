"""Placement: which devices (or CPU slots) each node replica runs on. A pure function of the graph
and an inventory of devices, so `dora run --dry-run` plans GPU pools on a machine without GPUs.

A pool is `count` devices of one kind. gpu pools take consecutive GPUs of the inventory in
declaration order (pools never share a GPU); inside a pool, nodes take consecutive slot ranges in
data-flow order and replica r of a node holding `devices` devices gets the next `devices` slots
(dora.graph.device_shares.assign_slots, which validation uses too). So {device: gpu, count: 8} with
a node of replicas 2, devices 4 gives CUDA_VISIBLE_DEVICES "0,1,2,3" and "4,5,6,7". Validation
guarantees a declared pool holds replicas x devices of all its nodes, unless every node in it
declares a memory share: then the slots wrap around and a device holds several replicas, each
with its share (`ReplicaPlacement.memory`; `Plan.sharing` says who shares with whom), the shares
on one device at most 100%. The implicit cpu pool "default" of nodes without a pool (one slot per
core) also wraps around and time-shares slots, with no shares.

Per replica: gpu -> CUDA_VISIBLE_DEVICES=<its GPUs>, torch device "cuda:0" (a TP engine sees all
of them); cpu -> CUDA_VISIBLE_DEVICES="" and threads = devices x (slots / devices used in the pool),
at least 1, which the worker applies to torch and the backend exports as OMP/MKL_NUM_THREADS.

Spares (`Spares`, asked for by the caller: the RL layer's elastic lending, dora/rl/elastic_lending.py):
a node gets extra replicas, numbered after its own, each on a share of a host node's devices (same
pool, slots and threads as the host: they time-share them, never running at the same time). They
do not count as the pool's users.

A sharded op's replicas (update, critic, reference) are the ranks of ONE process group: rank r
is replica r, rank 0 leads (it alone is wired to the data edges), and `Plan.data_replicas(node)` is
1 for such a node. The ranks rendezvous at rank 0's address, on a port rank 0 binds at start.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
from dora.graph.device_shares import assign_slots
from dora.graph.model import Graph, Pool
from dora.graph.printing import share_text
from dora.runtime.errors import PlacementError

DEFAULT_POOL = "default"


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The devices one machine offers: GPU ids as CUDA_VISIBLE_DEVICES names them, and CPU cores."""

    gpus: tuple[str, ...] = ()
    cpus: int = 1
    source: str = "given"      # where the GPU list came from (for messages)

    @staticmethod
    def detect() -> "Inventory":
        """This machine: CUDA_VISIBLE_DEVICES when set, else the NVIDIA driver's GPU list; no torch import."""
        cpus = max(1, os.cpu_count() or 1)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            ids = tuple(x.strip() for x in visible.split(",") if x.strip() and x.strip() != "-1")
            return Inventory(ids, cpus, f"CUDA_VISIBLE_DEVICES={visible!r}")
        found = len(glob.glob("/proc/driver/nvidia/gpus/*"))
        if not found:
            try:
                out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
                found = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
            except (OSError, subprocess.SubprocessError):
                found = 0
        return Inventory(tuple(str(i) for i in range(found)), cpus, "the NVIDIA driver" if found else "no NVIDIA GPU found")

    @staticmethod
    def planned(graph: Graph) -> "Inventory":
        """A machine with exactly the GPUs the graph's gpu pools declare (ids 0..N-1): what a plan
        shows without looking at hardware (--dry-run, the ray backend, where Ray picks the GPUs)."""
        need = sum(p.count for p in graph.pools.values() if p.device == "gpu" and isinstance(p.count, int))
        return Inventory(tuple(str(i) for i in range(need)), max(1, os.cpu_count() or 1), "the pools")


@dataclasses.dataclass
class ReplicaPlacement:
    node: str
    replica: int
    pool: str
    kind: str                # cpu | gpu
    slots: tuple[int, ...]   # pool-local device indices (gpu) or CPU slots (cpu) this replica holds
    device: str              # torch device string inside the worker
    threads: int
    env: dict[str, str]
    gpus: tuple[str, ...] = ()    # the inventory's GPU ids (what CUDA_VISIBLE_DEVICES lists)
    ranks: int = 0                # > 0: this replica is rank `replica` of a process group of `ranks`
    spare: str | None = None      # a spare (Spares): the host node whose devices it borrows
    endpoint: str | None = None   # the replica's inbox, known once it is running
    memory: float | None = None   # the node's declared share of each of its devices' memory (None: all of it)

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"

    @property
    def slot(self) -> int:
        return self.slots[0]

    @property
    def devices(self) -> int:
        return len(self.slots)


@dataclasses.dataclass(frozen=True)
class Spares:
    """`count` extra replicas of `node`, each on a share of `host`'s devices (a share = the devices
    one replica of `node` holds, across the host's ranks in order; on a cpu pool every spare gets
    the host's slots). They time-share those devices with the host: never at the same time."""

    node: str
    host: str
    count: int


@dataclasses.dataclass
class Plan:
    pools: dict[str, Pool]
    replicas: list[ReplicaPlacement]
    edges: list[str] = dataclasses.field(default_factory=list)   # one line per data edge: routing and capacity
    groups: dict[str, int] = dataclasses.field(default_factory=dict)   # sharded node -> ranks (> 1 only)
    inventory: Inventory = dataclasses.field(default_factory=Inventory)

    def of(self, node: str) -> list[ReplicaPlacement]:
        return [r for r in self.replicas if r.node == node]

    def get(self, node: str, replica: int) -> ReplicaPlacement:
        return next(r for r in self.replicas if r.node == node and r.replica == replica)

    def data_replicas(self, node: str) -> int:
        """Replicas a node shows on its data edges: 1 for a process group (rank 0 takes and emits)."""
        return 1 if node in self.groups else len(self.of(node))

    def sharing(self, node: str, other: str) -> list[int]:
        """Replicas of `node` that share a device with a replica of `other` by declared memory
        shares (both hold one; spares, which only borrow, left out)."""
        theirs = {(r.pool, s) for r in self.of(other) if r.memory is not None and not r.spare for s in r.slots}
        return [r.replica for r in self.of(node)
                if r.memory is not None and not r.spare and any((r.pool, s) in theirs for s in r.slots)]

    @property
    def shared(self) -> bool:
        """Some device holds several replicas by declared memory shares."""
        seen = [(r.pool, s) for r in self.replicas if r.memory is not None and not r.spare for s in r.slots]
        return len(seen) != len(set(seen))


def pools_of(graph: Graph, cpus: int | None = None) -> dict[str, Pool]:
    pools = dict(graph.pools)
    if any(n.pool is None for n in graph.nodes.values()) and DEFAULT_POOL not in pools:
        pools[DEFAULT_POOL] = Pool(DEFAULT_POOL, "cpu", max(1, cpus or os.cpu_count() or 1))
    return pools


def sharded_nodes(graph: Graph) -> set[str]:
    """Nodes whose op is sharded (dora.graph.opspec.OpSpec.sharded)."""
    from dora.graph.schema import resolve_all

    specs, _ = resolve_all(graph)
    return {n for n, s in specs.items() if s is not None and s.sharded}


def gpu_shortfall(graph: Graph, inventory: Inventory) -> str | None:
    """Why `inventory` cannot hold the graph's gpu pools (None: it can)."""
    gpu_pools = [(n, p.count) for n, p in graph.pools.items() if p.device == "gpu"]
    need = sum(c for _, c in gpu_pools)
    if need <= len(inventory.gpus):
        return None
    pools = ", ".join(f"{n} ({c})" for n, c in gpu_pools)
    on_cpu = " ".join(f"pools.{n}.device=cpu" for n, _ in gpu_pools)
    return (f"gpu pools {pools} need {need} GPU(s); this machine has {len(inventory.gpus)} ({inventory.source}). "
            "Lower the pools' count, set CUDA_VISIBLE_DEVICES, or use --backend ray on a cluster "
            f"(--dry-run shows the plan without GPUs). To try it on this machine's CPU, override: {on_cpu} "
            "(a model sized for GPUs is slow there: smaller model.* and async.train_batch make it a smoke test)")


def plan(graph: Graph, inventory: Inventory | None = None, sharded: set[str] | None = None,
         spares: Spares | list[Spares] | None = None) -> Plan:
    """Where every replica runs. `inventory` defaults to Inventory.planned(graph); `sharded` (the
    nodes whose replicas form one process group) defaults to what the ops declare; `spares` adds
    spare replicas on a host node's devices (a list: several nodes' spares, each on its own host)."""
    inventory = inventory or Inventory.planned(graph)
    sharded = sharded_nodes(graph) if sharded is None else sharded
    pools = pools_of(graph, inventory.cpus)
    used: dict[str, int] = {}
    for n in graph.nodes.values():
        pool = n.pool or DEFAULT_POOL
        if not isinstance(pool, str) or pool not in pools:
            raise PlacementError(f"node {n.name!r} names pool {pool!r}, which is not declared (pools: {sorted(pools)})")
        if pools[pool].device not in ("cpu", "gpu") or pools[pool].count < 1:
            raise PlacementError(f"pool {pool!r}: device must be cpu or gpu and count >= 1 (got {pools[pool].device!r}, {pools[pool].count})")
        if n.replicas < 1 or n.devices < 1:
            raise PlacementError(f"node {n.name!r}: replicas and devices must be >= 1 (got {n.replicas}, {n.devices})")
        used[pool] = used.get(pool, 0) + n.replicas * n.devices
    problem = gpu_shortfall(graph, inventory)
    if problem:
        raise PlacementError(problem)
    first_gpu, at = {}, 0
    for name, pool in pools.items():
        if pool.device == "gpu":
            first_gpu[name], at = at, at + pool.count
    out: list[ReplicaPlacement] = []
    held = assign_slots(graph, graph.topo_order(), {p.name: p.count for p in pools.values()},
                        lambda node: node.pool or DEFAULT_POOL)
    groups = {n: graph.nodes[n].replicas for n in sharded if n in graph.nodes and graph.nodes[n].replicas > 1}
    for name in graph.topo_order():
        n = graph.nodes[name]
        pool = pools[n.pool or DEFAULT_POOL]
        for r in range(n.replicas):
            slots = held[(name, r)]
            gpus: tuple[str, ...] = ()
            if pool.device == "gpu":
                threads = 1
                gpus = tuple(inventory.gpus[first_gpu[pool.name] + s] for s in slots)
                env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
                device = "cuda:0"
            else:
                threads = n.devices * max(1, pool.count // used[pool.name])
                env = {"CUDA_VISIBLE_DEVICES": ""}
                device = "cpu"
            env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
            out.append(ReplicaPlacement(name, r, pool.name, pool.device, slots, device, threads, env, gpus,
                                        groups.get(name, 0), memory=n.memory))
    for one in [spares] if isinstance(spares, Spares) else spares or []:
        out += _spare_placements(graph, out, one)
    p = Plan(pools, out, [], groups, inventory)
    for e in graph.edges:
        how = f"group_by {e.group_by}" if e.group_by else e.routing
        p.edges.append(f"{e.label}: {p.data_replicas(e.src)} -> {p.data_replicas(e.dst)} replica(s), {how}, capacity "
                       f"{e.capacity} batches / {e.capacity_bytes} bytes per producer replica")
    return p


def _spare_placements(graph: Graph, placed: list[ReplicaPlacement], spares: Spares | None) -> list[ReplicaPlacement]:
    if spares is None or spares.count < 1:
        return []
    hosts = [r for r in placed if r.node == spares.host]
    host = hosts[0]                       # pool, device, threads: every rank's are alike
    first, width = graph.nodes[spares.node].replicas, graph.nodes[spares.node].devices
    out = []
    for i in range(spares.count):
        if host.kind == "gpu":   # the i-th share of the host's GPUs, across its ranks in order
            slots = tuple(s for r in hosts for s in r.slots)[i * width:(i + 1) * width]
            gpus = tuple(g for r in hosts for g in r.gpus)[i * width:(i + 1) * width]
            env = {**host.env, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        else:
            slots, gpus, env = host.slots, (), dict(host.env)
        out.append(ReplicaPlacement(spares.node, first + i, host.pool, host.kind, slots, host.device, host.threads,
                                    env, gpus, 0, spare=spares.host))
    return out


def endpoint_hint(backend: str, node: str, replica: int) -> str:
    """What a replica's inbox will be, before it binds (ports and folders are chosen at start)."""
    if backend == "local":
        from dora.runtime.backends.local import resolve_transport
        if resolve_transport() == "ipc":
            return f"ipc://<run's socket folder>/{node}-{replica}.sock"
        return "tcp://127.0.0.1:<random port>"
    return "tcp://<node address>:<random port>"


def _where(r: ReplicaPlacement, backend: str | None) -> str:
    if r.kind == "gpu":
        what = f"gpu {','.join(r.gpus)}" if len(r.gpus) == 1 else f"gpus {','.join(r.gpus)} (TP {len(r.gpus)})"
        if backend == "ray":
            return f"{what.replace('gpu', 'pool gpu', 1)}: Ray picks the GPUs"
        return f"{what} (CUDA_VISIBLE_DEVICES={r.env['CUDA_VISIBLE_DEVICES']})"
    slots = f"cpu slot {r.slot}" if r.devices == 1 else f"cpu slots {','.join(map(str, r.slots))}"
    return f"{slots}, {r.threads} thread(s)"


def _shares(p: Plan, pool: Pool) -> list[str]:
    """One line per device of `pool` that several replicas share by memory shares."""
    on: dict[int, list[ReplicaPlacement]] = {}
    for r in p.replicas:
        if r.pool == pool.name and r.memory is not None and not r.spare:
            for s in r.slots:
                on.setdefault(s, []).append(r)
    lines = []
    for s, rs in sorted(on.items()):
        if len(rs) > 1:
            name = f"gpu {rs[0].gpus[rs[0].slots.index(s)]}" if pool.device == "gpu" else f"cpu slot {s}"
            parts = " + ".join(f"{r.label} {share_text(r.memory)}" for r in rs)
            lines.append(f"{name}: {parts} = {share_text(sum(r.memory for r in rs))} of its memory")
    return lines


def format_plan(p: Plan, backend: str | None = None, machine: Inventory | None = None) -> str:
    """A readable table for `dora run --dry-run`; `machine` (this machine's inventory) adds a line
    saying whether a local run here would get the GPUs the plan needs."""
    lines = ["pools:"]
    for pool in p.pools.values():
        users = sorted({r.node for r in p.replicas if r.pool == pool.name})
        taken = sum(r.devices for r in p.replicas if r.pool == pool.name and not r.spare)   # spares only borrow
        share = " (colocated, time-shared)" if len(users) > 1 and taken > pool.count else (
            " (colocated)" if len(users) > 1 else "")
        shares = _shares(p, pool)
        if shares:
            share = " (devices shared by memory shares)"
        lines.append(f"  {pool.name}: {pool.count} x {pool.device}, {taken} used  nodes: {', '.join(users) or '-'}{share}")
        lines.extend(f"    {line}" for line in shares)
    lines.append("replicas:")
    w = max((len(r.label) for r in p.replicas), default=4)
    for r in p.replicas:
        ep = r.endpoint or (endpoint_hint(backend, r.node, r.replica) if backend else "<bound at start>")
        rank = ""
        if r.ranks:
            rank = f"  rank {r.replica}/{r.ranks}" + (" (leader: data in, events out)" if r.replica == 0 else "")
        inbox = f"inbox {ep}" if not r.ranks or r.replica == 0 else "no data edges"
        if r.spare:
            rank = f"  spare on {r.spare}'s devices (asleep until lent)"
        where = _where(r, backend) + (f", memory {share_text(r.memory)}" if r.memory is not None else "")
        lines.append(f"  {r.label:<{w}}  pool {r.pool:<10} {where:<46} device {r.device:<7} {inbox}{rank}")
    if p.groups:
        lines.append("process groups (FSDP):")
        for node, ranks in p.groups.items():
            kind = p.get(node, 0).kind
            lines.append(f"  {node}: one trainer of {ranks} ranks ({'nccl' if kind == 'gpu' else 'gloo'}); rendezvous at "
                         f"{node}[0]'s address, port bound at start")
    if p.edges:
        lines.append("edges:")
        lines.extend(f"  {e}" for e in p.edges)
    if machine is not None and backend != "ray":
        need = sum(pool.count for pool in p.pools.values() if pool.device == "gpu")
        if need:
            have = len(machine.gpus)
            verdict = "enough" if have >= need else "a local run here would stop with exit 2"
            lines.append(f"inventory: the gpu pools need {need} GPU(s); this machine has {have} ({machine.source}): {verdict}")
    return "\n".join(lines)

