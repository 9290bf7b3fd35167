"""The ray backend: one actor per node replica, one placement group per pool, the same worker code.

Each pool becomes a placement group with one bundle per slot (gpu: {"GPU": 1}; cpu: a share of
the cluster's CPUs so that every pool fits); replica r of a node runs in bundle r % count, its
actor asking for an equal share of that bundle. The actor's `run` method runs dora's Worker
loop; data and control go over dora's own zmq channels (Ray only places and supervises the
processes; its own task transport is not used for data). On one machine endpoints bind
127.0.0.1; on a multi-node cluster each worker binds its node's IP.

Started here when Ray is not already initialised: ray.init(num_cpus=..., include_dashboard=False),
with RAY_AUTH_MODE=disabled and this process's sys.path exported so actors import the same ops.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Any

from dora.runtime.backends import Launch


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

    def __init__(self, address: str | None = None, num_cpus: int | None = None, host: str | None = None):
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
        self.groups: list[Any] = []
        self._reported: set[str] = set()

    def start(self, launches: list[Launch]) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.ray
        by_pool: dict[str, list[Launch]] = collections.defaultdict(list)
        for ln in launches:
            by_pool[ln.pool].append(ln)
        slots = {p: 1 + max(ln.slot for ln in lns) for p, lns in by_pool.items()}
        cpu_bundles = sum(n for p, n in slots.items() if by_pool[p][0].kind == "cpu")
        cpus = float(ray.available_resources().get("CPU", 1.0))
        cpu_share = round(min(1.0, cpus / max(1, cpu_bundles)), 4)
        Actor = _actor_class()
        for pool, lns in by_pool.items():
            gpu = lns[0].kind == "gpu"
            bundles = [{"GPU": 1.0} if gpu else {"CPU": cpu_share} for _ in range(slots[pool])]
            pg = placement_group(bundles, strategy="PACK", name=f"dora-{pool}-{os.getpid()}")
            ray.get(pg.ready(), timeout=120)
            self.groups.append(pg)
            per_slot = collections.Counter(ln.slot for ln in lns)
            for ln in lns:
                self._reported.discard(ln.label)   # (a respawn starts a replica again under its label)
                share = 1.0 / per_slot[ln.slot]
                env = {k: v for k, v in ln.env.items() if not (gpu and k == "CUDA_VISIBLE_DEVICES")}  # Ray sets it for GPU actors
                actor = Actor.options(
                    num_cpus=0 if gpu else max(0.0001, round(cpu_share * share, 4) - 0.0001),
                    num_gpus=round(share, 4) if gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=ln.slot),
                ).remote()
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

        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        if self.started_ray:
            ray.shutdown()
            time.sleep(0.2)
