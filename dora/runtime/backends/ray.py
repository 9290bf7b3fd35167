"""The ray backend: one actor per node replica in its own placement group, the same worker code.

A replica's placement group is one bundle holding all its devices, strategy STRICT_PACK, so a
tensor-parallel group (generate with devices: N) lands on one node with N GPUs, and Ray sets its
CUDA_VISIBLE_DEVICES. A device is {"GPU": 1} for a gpu pool, or the custom resource the option
`pool_resources={pool: NAME}` names (node types of a heterogeneous cluster; tests stand in for
GPUs this way); a cpu pool without one gets a share of the cluster's CPUs. Groups are placed
largest first (first-fit decreasing), each waited for with a deadline that names the replica.
The ranks of a sharded trainer are replicas like any other: each its own group, so they may land
on different nodes and rendezvous at rank 0's node address (dora/ops/sharding/rank_group.py).

The actor's `run` method runs dora's Worker loop; data and control go over dora's own zmq
channels (Ray only places and supervises the processes; its own task transport is not used for
data). On one machine endpoints bind 127.0.0.1; on a multi-node cluster each worker binds its
node's IP.

Started here when Ray is not already initialised: ray.init(num_cpus=..., include_dashboard=False),
with RAY_AUTH_MODE=disabled and this process's sys.path exported so actors import the same ops.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from dora.runtime.backends.launch_spec import Launch

PLACEMENT_TIMEOUT_S = 120.0   # one replica's placement group: the cluster has the resources, or it never will


def _actor_class():
    import ray

    @ray.remote(max_restarts=0, max_concurrency=1)
    class WorkerActor:
        def run(self, control: str, node: str, replica: int, host: str, env: dict[str, str], keys=None) -> int:
            os.environ.update(env)
            if host == "auto":
                host = ray.util.get_node_ip_address()
            from dora.runtime import security
            from dora.runtime.worker import Worker

            security.install(keys)   # the run's CURVE keys, passed with the actor's arguments

            return Worker(control, node, replica, host).run()

    return WorkerActor


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, host: str | None = None,
                 pool_resources: dict[str, str] | None = None):
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        self.ray = ray
        self.started_ray = False
        if not ray.is_initialized():
            path = os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)] + [os.getcwd()])
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_AUTH_MODE": "disabled"}})
            self.started_ray = True
        multi = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
        self.host = host or (ray.util.get_node_ip_address() if multi else "127.0.0.1")
        self.worker_host = "auto" if multi else "127.0.0.1"
        self.multi_node = multi   # sockets leave the machine: the run secures them (security.py)
        self.actors: dict[str, Any] = {}
        self.refs: dict[Any, str] = {}
        self.group_of: dict[str, Any] = {}   # replica label -> its placement group
        self.pool_resources = dict(pool_resources or {})
        self.placement: dict[str, str] = {}    # replica label -> the Ray node id its placement group landed on
        self._reported: set[str] = set()

    def device_resource(self, ln: Launch) -> str | None:
        """The Ray resource one device of this replica's pool is (None: a plain share of CPUs)."""
        return self.pool_resources.get(ln.pool) or ("GPU" if ln.kind == "gpu" else None)

    def start(self, launches: list[Launch]) -> None:
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.ray
        shared = sum(ln.devices for ln in launches if self.device_resource(ln) is None)
        cpus = float(ray.available_resources().get("CPU", 1.0))
        cpu_share = round(min(1.0, cpus / max(1, shared)), 4)
        Actor = _actor_class()
        for ln in sorted(launches, key=lambda ln: -ln.devices):   # first-fit decreasing: TP groups first
            res = self.device_resource(ln)
            bundle = {res: float(ln.devices)} if res else {"CPU": round(cpu_share * ln.devices, 4)}
            old = self.group_of.pop(ln.label, None)
            if old is not None:   # a respawn: its predecessor's devices are free again
                remove_placement_group(old)
            pg = placement_group([bundle], strategy="STRICT_PACK", name=f"dora-{ln.label}-{os.getpid()}")
            try:
                ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
            except Exception as e:
                raise RuntimeError(f"ray: no node can hold {ln.label} (pool {ln.pool!r}, {ln.devices} device(s): "
                                   f"{bundle}) within {PLACEMENT_TIMEOUT_S:.0f} s; cluster resources "
                                   f"{ray.cluster_resources()}") from e
            self.group_of[ln.label] = pg
            self.placement[ln.label] = placement_group_table(pg)["bundles_to_node_id"][0]
            env = {k: v for k, v in ln.env.items() if not (res == "GPU" and k == "CUDA_VISIBLE_DEVICES")}  # Ray sets it
            actor = Actor.options(
                num_cpus=0 if res else max(0.0001, bundle["CPU"] - 0.0001),
                num_gpus=float(ln.devices) if res == "GPU" else 0,
                resources={res: float(ln.devices)} if res not in (None, "GPU") else {},
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
            ).remote()
            self._reported.discard(ln.label)   # (a respawn starts a replica again under its label)
            self.refs = {ref: lb for ref, lb in self.refs.items() if lb != ln.label}   # its predecessor's is news no more
            self.actors[ln.label] = actor
            self.refs[actor.run.remote(ln.control, ln.node, ln.replica, self.worker_host, env, ln.keys)] = ln.label

    def kill(self, label: str) -> None:
        """End one replica's actor now (a respawn replaces a hung or failed one)."""
        actor = self.actors.get(label)
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.refs = {ref: lb for ref, lb in self.refs.items() if lb != label}

    def exited(self) -> list[tuple[str, str]]:
        if not self.refs:
            return []
        done, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        out = []
        for ref in done:
            label = self.refs[ref]
            if label in self._reported:
                continue
            self._reported.add(label)
            try:
                rc = self.ray.get(ref, timeout=1)
                out.append((label, f"actor returned {rc}"))
            except Exception as e:  # RayActorError when the process was killed
                out.append((label, f"actor died: {type(e).__name__}: {str(e).splitlines()[0][:300]}"))
        return out

    def shutdown(self, timeout_s: float = 10.0) -> None:
        ray = self.ray
        if self.refs:
            ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout_s)
        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        from ray.util.placement_group import remove_placement_group

        for pg in self.group_of.values():
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        if self.started_ray:
            ray.shutdown()
            time.sleep(0.2)
