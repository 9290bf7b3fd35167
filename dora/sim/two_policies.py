"""Several policies on one shared rollout pool, simulated: `dora simulate --policy NAME:WORKLOAD:TBS
--policy ... [--splits static,load]`.

Each policy runs the real RolloutController (its own versions, window K, TransferQueue, ledger) with
its own SimTrainer on trainer GPUs of its own; the rollout instances are one pool, one per policy as
its base and the rest split between the policies by a PolicySplit (dora/sim/policy_split.py). The
run goes on until every policy has trained its steps; what it measures is how the split serves them:
each policy's step time and tokens/s, when it finished, the instances it held on average, and how
many instances changed policy. Everything else (mode, model, GPUs, K, seed) is the run's SimConfig.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dora.observe.trace import TraceWriter
from dora.rl.rollout import RolloutConfig, RolloutController

from .costmodel import MODELS, CostModel
from .policy_split import PolicySplit
from .sim_instance import SimInstance
from .simulator import SimConfig, SimulationError, placement
from .trainer import SimTrainer
from .virtual_clock import VirtualClock
from .workloads import PromptSource, get_workload


@dataclasses.dataclass
class SimPolicy:
    name: str
    workload: str
    train_batch: int

    @staticmethod
    def parse(text: str) -> "SimPolicy":
        """NAME:WORKLOAD:TBS, e.g. solver:dapo-math:4096."""
        parts = text.split(":")
        if len(parts) != 3 or not parts[0] or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"--policy {text!r}: expected NAME:WORKLOAD:TBS, e.g. solver:dapo-math:4096")
        return SimPolicy(parts[0], parts[1], int(parts[2]))


def simulate_policies(cfg: SimConfig, policies: list[SimPolicy], split: str, trace: TraceWriter | None = None) -> dict[str, Any]:
    """Every policy to cfg.steps steps on one shared pool, split by `split`; the run's row."""
    if len(policies) < 2 or len({p.name for p in policies}) != len(policies):
        raise ValueError("--policy: give at least two policies with different names")
    trace = trace or TraceWriter(enabled=False)
    cost, clock = CostModel(MODELS[cfg.model]), VirtualClock()
    tp = cost.model.tp
    train = {p.name: cfg.train_gpus or placement(dataclasses.replace(cfg, gpus=cfg.gpus // len(policies),
                                                                     train_batch=p.train_batch),
                                                 cost, get_workload(p.workload, None))[1] for p in policies}
    n = (cfg.gpus - sum(train.values())) // tp
    if n < len(policies):
        raise ValueError(f"--gpus {cfg.gpus}: after the trainers' {sum(train.values())} GPUs there are {n} rollout "
                         f"instances of {tp} GPUs, fewer than the {len(policies)} policies")
    ctl: dict[str, RolloutController] = {}

    def on_finished(name, done):   # the instance's current holder
        next(c for c in ctl.values() if name in c.manager.instances).on_finished(name, done)

    pool = [SimInstance(f"rollout{i}", cost, clock, on_finished, trace) for i in range(n)]
    for i in pool:
        i.slots = cfg.max_batch or i.slots
        i.kv_capacity = cfg.kv_tokens or i.kv_capacity
        i.hv.limit = cfg.versions_per_instance
    trainers = {}
    for k, p in enumerate(policies):
        rcfg = RolloutConfig(mode=cfg.mode, train_batch=p.train_batch, rollout_batch=0, group_size=cfg.group_size,
                             max_staleness=cfg.max_staleness, versions_per_instance=cfg.versions_per_instance,
                             **cfg.rollout).resolved()
        source = PromptSource(get_workload(p.workload, None), cfg.group_size, cfg.seed + 1000 * k)
        ctl[p.name] = RolloutController(rcfg, [pool[k]], source, clock, trace)
        trainers[p.name] = SimTrainer(ctl[p.name], cost, clock, train[p.name], trace)
    splitter = PolicySplit(ctl, pool[len(policies):], split, clock)
    finished_at = _drive(cfg, clock, ctl, trainers, splitter)
    return _row(cfg, split, policies, ctl, trainers, splitter, finished_at, train, n)


def _drive(cfg: SimConfig, clock: VirtualClock, ctl: dict[str, RolloutController], trainers: dict[str, SimTrainer],
           splitter: PolicySplit) -> dict[str, float]:
    def tick() -> None:
        for c in ctl.values():
            c.tick()
        clock.call_later(cfg.tick_s, tick)

    for c in ctl.values():
        c.start()
    splitter.start()
    clock.call_later(cfg.tick_s, tick)
    steps = {u: 0 for u in ctl}
    finished_at: dict[str, float] = {}
    last = 0.0
    while len(finished_at) < len(ctl):
        if not clock.step():
            raise SimulationError(f"event queue empty before every policy finished (steps {steps})")
        for u, t in trainers.items():
            if u not in finished_at:
                t.maybe_start()
        moved = [u for u, t in trainers.items() if t.step != steps[u]]
        for u in moved:
            steps[u] = trainers[u].step
            last = clock.now()
            if steps[u] >= cfg.steps:
                finished_at[u] = clock.now()
                splitter.done.add(u)   # its work no longer counts
        if moved:
            splitter.rebalance()
        elif clock.now() - last > cfg.max_idle_sim_s:
            raise SimulationError(f"no training step for {cfg.max_idle_sim_s:.0f} simulated seconds (steps {steps})")
    return finished_at


def _row(cfg, split, policies, ctl, trainers, splitter, finished_at, train, n) -> dict[str, Any]:
    shares = splitter.shares()
    row: dict[str, Any] = {"split": split, "mode": cfg.mode, "model": cfg.model, "gpus": cfg.gpus,
                           "rollout_instances": n, "steps": cfg.steps, "makespan_s": max(finished_at.values()),
                           "instances_moved": splitter.moves, "policies": {}}
    for p in policies:
        c, t = ctl[p.name], trainers[p.name]
        acc = c.finish()
        ends = t.step_ends[:cfg.steps]
        warm = max(1, cfg.steps // 5) if cfg.steps >= 3 else 0
        span = ends[-1] - (ends[warm - 1] if warm else 0.0)
        row["policies"][p.name] = {
            "workload": p.workload, "train_batch": p.train_batch, "train_gpus": train[p.name],
            "finished_s": finished_at[p.name], "step_time_s": span / (len(ends) - warm),
            "tokens_per_s": sum(t.step_tokens[warm:cfg.steps]) / span,
            "instances_held": 1 + shares[p.name],   # its base instance and its time-averaged share of the rest
            "c1_violations": acc["c1_violations"], "c2_violations": acc["c2_violations"],
            "c3_violations": acc["c3_violations"], "lost": acc["lost"]}
    return row
