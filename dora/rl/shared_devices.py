"""Generate replicas that share their devices with the trainer by declared memory shares, driven
by the RL driver (the shares: dora/graph/device_shares.py; which replicas: the runtime's
`Plan.sharing`).

In a colocated mode (its policy says so: sync, where the next batch is dispatched only once the
version it trains on is published; partial_colocated, which interrupts every request when the
trainer takes its batch and resumes them at the publish) nothing is generated while the trainer
steps. So those replicas hand the device's memory to the trainer for the step:

    before the step   right before the batch is sent, each sharing replica sleeps; it holds no
                      version then. The trainer's allocator is capped at its own share, so the
                      engine keeps what its captured CUDA graphs point to (weights, KV tensor) and
                      the graphs survive: nothing is captured again at the next version (on CPU, with
                      no graphs, it releases its KV and weights)
    at the publish    each wakes (allocates its weights' memory), then the rollout controller hears
                      of the new version and loads it on every idle instance that holds another
                      (BatchPolicy.on_published) before it dispatches the next batch

In the other modes rollout runs while the trainer steps and each keeps its share. The sleep and wake
calls are ReplicaInstance's, the ones elastic lending makes (elastic_lending.py). What it costs is
charged to the run: trace spans `sleep` / `wake` on the replica's row, per-step metrics
`shared_sleep_s`, `shared_wake_s`, `shared_bytes_released`, and summary.json's `shared_devices`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.graph.settings_check import ENGINES_THAT_SLEEP
from dora.rl.replica_instance import ReplicaInstance
from dora.rl.rollout import POLICIES


def shared_devices(driver, instances: list[ReplicaInstance]) -> "SharedDevices | None":
    """The RLDriver's generate replicas that share the trainer's devices by declared memory shares,
    when they hand it their memory while it steps: a colocated mode (nothing is generated then) and
    an engine that can sleep. None when none do."""
    roles = driver.roles
    if not POLICIES[driver.cfg.mode].colocated or driver.params[roles.generate]["engine"] not in ENGINES_THAT_SLEEP:
        return None
    sharing = set(driver.ctrl.plan.sharing(roles.generate, roles.update))
    return SharedDevices(driver, [i for i in instances if i.replica in sharing]) if sharing else None


@dataclasses.dataclass
class SharedTotals:
    sleeps: int = 0
    wakes: int = 0
    sleep_s: float = 0.0           # the sleeps before each step: what the trainer waits for
    wake_s: float = 0.0            # the wakes at each publish (the version's load is a weight load like any)
    bytes_released: int = 0        # weights + KV memory the replicas handed back
    skipped_busy: int = 0          # a replica that still held requests at a step stayed awake (never expected in a colocated mode)


class SharedDevices:
    def __init__(self, driver, instances: list[ReplicaInstance]):
        """`driver`: the RLDriver (its rollout controller, clock); `instances`: the generate
        replicas on the trainer's devices."""
        self.d, self.instances = driver, instances
        self.asleep: set[str] = set()
        self.totals = SharedTotals()
        self._at_last_step = SharedTotals()

    def before_step(self) -> None:
        """The batch is about to go to the trainer: the replicas sharing its devices sleep."""
        d = self.d
        t0 = d.clock.now()
        for inst in self.instances:
            if inst.name in self.asleep:
                continue
            if d.rc.manager.on_instance.get(inst.name):
                self.totals.skipped_busy += 1
                continue
            self.totals.bytes_released += inst.sleep(keep_graphs=True)
            self.asleep.add(inst.name)
            self.totals.sleeps += 1
        self.totals.sleep_s += d.clock.now() - t0

    def publish(self, version: int) -> None:
        """The trainer published `version`: the sleepers wake, then the rollout controller loads it
        on them and dispatches."""
        d = self.d
        t0 = d.clock.now()
        for inst in self.instances:
            if inst.name in self.asleep:
                inst.wake()
                self.asleep.discard(inst.name)
                self.totals.wakes += 1
        self.totals.wake_s += d.clock.now() - t0
        d.rc.on_published(version)

    def replaced(self, name: str) -> None:
        """A replica was respawned: the new process starts awake (with the initial weights)."""
        self.asleep.discard(name)

    def step_metrics(self) -> dict[str, Any]:
        now, last = self.totals, self._at_last_step
        self._at_last_step = dataclasses.replace(now)
        return {"shared_sleep_s": now.sleep_s - last.sleep_s, "shared_wake_s": now.wake_s - last.wake_s,
                "shared_bytes_released": now.bytes_released - last.bytes_released}

    def summary(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.totals), "replicas": [i.name for i in self.instances]}
