"""The cluster simulator: the real RolloutController driven on a VirtualClock by SimInstances
and a SimTrainer whose costs come from the cost model.

Placement: a mode whose policy is `colocated` (sync, partial_colocated) shares every GPU: every
GPU generates, then every GPU trains (the policy's barrier guarantees they never overlap, and the
simulator checks it at each step's start). The other modes are disaggregated: a trainer pool and
a rollout pool, split in proportion to their expected work per step (`--train-gpus` overrides),
identical for every disaggregated mode.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

from dora.graph.model import AsyncConfig
from dora.observe.trace import TraceWriter
from dora.rl.rollout import POLICIES, RolloutConfig, RolloutController

from .virtual_clock import VirtualClock
from .costmodel import MODELS, CostModel
from .elastic_devices import ElasticDevices
from .sim_evals import SimEvals
from .sim_instance import SimInstance
from .trainer import SimTrainer
from .workloads import PromptSource, Workload, get_workload, response_tokens


DEFAULT_VERSIONS: int = AsyncConfig.__dataclass_fields__["versions_per_instance"].default   # declared once there
DEFAULT_FAST_LANES: int = AsyncConfig.__dataclass_fields__["fast_lanes"].default
ROLLOUT_EFFICIENCY = 0.85   # assumed rollout pool vs full-batch decode bound; only picks the (shared) split


class SimulationError(RuntimeError):
    pass


@dataclasses.dataclass
class SimConfig:
    mode: str = "dora"
    model: str = "qwen2.5-32b"
    gpus: int = 64
    steps: int = 20
    seed: int = 0
    train_batch: int = 8192
    rollout_batch: int = 0          # 0 = mode default
    group_size: int = 16
    max_staleness: int = 3
    workload: str = "dapo-math"
    trace_file: str | None = None
    train_gpus: int = 0             # 0 = balanced split (disaggregated modes)
    tick_s: float = 5.0
    max_batch: int = 0              # override the model's slots per instance (0 = model default)
    kv_tokens: int = 0              # override KV capacity per instance in tokens (0 = from the cost model)
    rollout: dict = dataclasses.field(default_factory=dict)   # extra RolloutConfig fields (thresholds)
    max_idle_sim_s: float = 86400.0  # no training step for this long (simulated) = stuck
    drop_groups: float = 0.0        # DAPO dynamic sampling: this fraction of finished groups is dropped (seeded)
    elastic: bool = False           # trainer devices serve rollout while the trainer waits (every mode; sync has none)
    versions_per_instance: int = DEFAULT_VERSIONS   # M: versions one rollout instance may host at once
    fast_lanes: int = DEFAULT_FAST_LANES            # instances fast lanes may take (-1: as measured, 0: none)
    kv_offload: bool = False        # preempted requests' KV goes to host memory instead of being recomputed
    eval_every: int = 0             # held-out evaluation of version 0 and every N-th version (0: none)
    eval_prompts: int = 0           # its requests (one sample per prompt, lengths from the workload)


def versions_problem(cost: CostModel, workload: Workload, versions: int) -> str | None:
    """Why one instance cannot host `versions` weight copies next to one request of the workload's
    maximum length (the longest of a step's draws), or None."""
    w = workload.stats()
    return cost.versions_problem(versions, int(w.longest_prompt + response_tokens(w.longest)))


def placement(cfg: SimConfig, cost: CostModel, workload: Workload) -> tuple[int, int, bool]:
    """(rollout instances, trainer GPUs, colocated)."""
    tp = cost.model.tp
    if cfg.gpus < tp or cfg.gpus % tp:
        raise ValueError(f"--gpus {cfg.gpus} must be a positive multiple of the rollout TP size {tp} ({cost.model.name})")
    if POLICIES[cfg.mode].colocated:   # rollout and training never overlap: they share every GPU
        return cfg.gpus // tp, cfg.gpus, True
    if cfg.train_gpus:
        train = cfg.train_gpus
    else:
        # balance: minimise max(trainer time (fixed + work / train GPUs), rollout time (work / rollout GPUs))
        w = workload.stats()
        n = cfg.train_batch
        roll = n * cost.rollout_gpu_s(w.prompt, w.decoded, w.tool_tokens, w.ctx_per_decoded) / ROLLOUT_EFFICIENCY
        trn = cost.train_gpu_s(n * w.train_tokens)
        train = min(range(1, cfg.gpus - tp + 1),
                    key=lambda t: max(cost.train_fixed_s + trn / t, roll / ((cfg.gpus - t) // tp * tp)))
    rollout = (cfg.gpus - train) // tp
    if rollout < 1 or train < 1:
        raise ValueError(f"--gpus {cfg.gpus}: cannot split into a trainer pool and >= 1 rollout group of {tp} GPUs")
    return rollout, cfg.gpus - rollout * tp, False


def ideal(cfg: SimConfig) -> dict[str, float]:
    """The best step time any mode could reach at staleness K = cfg.max_staleness: the larger of
    two bounds, both reported.
    - capacity: the step's work with no bubble, rollout at its most efficient batch; the best of
      colocated (all work over all GPUs, plus the trainer's fixed per-step cost) and disaggregated
      at the best real-valued split T (max(fixed + train work / T, rollout work / (N - T))).
    - latency floor: a step's longest trajectory cannot be generated faster than alone on an
      instance (batch 1: `CostModel.lone_s`). With K = 0 it precedes the step's training; with
      K >= 1 its version's data may be trained up to K steps after the version is published, and
      a version can hold at most (K+1) x TBS trajectories (the staleness room), so over a run
      only every (K+1)-th version needs to carry the long ones: step >= lone / (K + 1)."""
    cost = CostModel(MODELS[cfg.model])
    w = get_workload(cfg.workload, cfg.trace_file).stats(seed=cfg.seed + 1, step_trajectories=cfg.train_batch)
    n, N = cfg.train_batch, cfg.gpus
    roll = n * cost.rollout_gpu_s(w.prompt, w.decoded, w.tool_tokens, w.ctx_per_decoded)
    trn = cost.train_gpu_s(n * w.train_tokens)
    colocated = (roll + trn) / N + cost.train_fixed_s
    lo, hi = 1e-6, N - 1e-6                  # trainer time falls with T, rollout time rises: bisect
    for _ in range(100):
        t = (lo + hi) / 2
        if cost.train_fixed_s + trn / t > roll / (N - t):
            lo = t
        else:
            hi = t
    split = max(cost.train_fixed_s + trn / lo, roll / (N - lo))
    capacity = min(colocated, split)
    lone = cost.lone_s(w.longest_prompt, w.longest)
    k = cfg.max_staleness
    floor = lone + cost.train_fixed_s + trn / N if k == 0 else lone / (k + 1)
    step = max(capacity, floor)
    return {"mode": "ideal", "step_time_s": step, "tokens_per_s": n * w.train_tokens / step,
            "capacity_step_s": capacity, "latency_floor_step_s": floor, "longest_alone_s": lone,
            "bound": "capacity" if capacity >= floor else "latency",
            "rollout_only_fraction": 0.0, "bubble_fraction": 0.0, "overhead_fraction": 0.0}


def _dropping(holder: dict[str, RolloutController], cfg: SimConfig):
    """on_finished for the instances; with drop_groups > 0 a filter drops that fraction of the
    groups as they complete (all rewards equal), as DAPO's dynamic sampling does."""
    if cfg.drop_groups <= 0:
        return lambda name, done: holder["c"].on_finished(name, done)
    rng, left = random.Random(cfg.seed + 7919), collections.Counter()

    def on_finished(name, done):
        holder["c"].on_finished(name, done)
        for f in done:
            gid = f.uid.rsplit(".", 1)[0]
            left[gid] += 1
            if left[gid] == cfg.group_size:
                del left[gid]
                if rng.random() < cfg.drop_groups:
                    holder["c"].on_dropped([f.uid], "filtered")      # drops the uid's whole group
    return on_finished


@dataclasses.dataclass
class _Sim:
    """The parts of one simulated run, as simulate() builds them."""

    cfg: SimConfig
    cost: CostModel
    clock: VirtualClock
    ctl: RolloutController
    trainer: SimTrainer
    instances: list[SimInstance]
    lendable: list[SimInstance]
    elastic: ElasticDevices
    train_gpus: int
    colocated: bool
    evals: SimEvals | None = None

    def busy_snapshot(self) -> dict[str, float]:
        """Cumulative device-seconds busy (rollout, overhead, training), tokens and rollout-only time now."""
        everyone = self.instances + self.lendable
        for i in everyone:
            i._advance()
        tp = self.cost.model.tp
        return {"t": self.clock.now(),
                "roll_busy": tp * sum(i.busy_s() for i in everyone),
                "overhead": tp * sum(i.overhead_s() for i in everyone) + self.train_gpus * self.elastic.handback_s,
                "train": (self.trainer.train_s + self.elastic.handback_s) * self.train_gpus,
                "tokens": self.trainer.tokens, "rollout_only": self.ctl.totals["rollout_only_s"]}


def simulate(cfg: SimConfig, trace: TraceWriter | None = None, observer=None) -> dict[str, Any]:
    """Run one mode. `observer(controller, trainer, instances)`, if given, is called once the
    parts are built (tests use it to watch events)."""
    if cfg.model not in MODELS:
        raise ValueError(f"unknown model {cfg.model!r}; expected one of {', '.join(MODELS)}")
    if cfg.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {cfg.steps}")
    workload = get_workload(cfg.workload, cfg.trace_file)
    if hasattr(workload, "check"):            # a run's length trace: its steps and groups bound ours
        workload.check(cfg.train_batch, cfg.group_size)
    problem = versions_problem(CostModel(MODELS[cfg.model]), workload, cfg.versions_per_instance)
    if problem:
        raise ValueError(f"versions_per_instance {cfg.versions_per_instance}: {problem}")
    sim = _build(cfg, trace or TraceWriter(enabled=False))
    if cfg.fast_lanes >= len(sim.instances):
        raise ValueError(f"fast_lanes {cfg.fast_lanes} leaves no rollout instance for the newest version: "
                         f"{cfg.mode} runs {len(sim.instances)} instance(s) on {cfg.gpus} GPUs")
    if observer is not None:
        observer(sim.ctl, sim.trainer, sim.instances)
    warm = max(1, cfg.steps // 5) if cfg.steps >= 3 else 0   # steps before the measured window
    snap = _drive(sim, warm)
    return _results(sim, warm, snap, sim.busy_snapshot())


def _build(cfg: SimConfig, trace: TraceWriter) -> _Sim:
    cost = CostModel(MODELS[cfg.model])
    workload = get_workload(cfg.workload, cfg.trace_file)
    n_inst, train_gpus, colocated = placement(cfg, cost, workload)
    clock = VirtualClock()
    rcfg = RolloutConfig(mode=cfg.mode, train_batch=cfg.train_batch, rollout_batch=cfg.rollout_batch,
                         group_size=cfg.group_size, max_staleness=cfg.max_staleness,
                         versions_per_instance=cfg.versions_per_instance, fast_lanes=cfg.fast_lanes,
                         **cfg.rollout).resolved()
    prompts = PromptSource(workload, cfg.group_size, cfg.seed)
    holder: dict[str, RolloutController] = {}
    on_finished = _dropping(holder, cfg)       # one for all instances (one filter, one seeded stream)
    if cfg.eval_every and cfg.eval_prompts:    # held-out evaluation requests go to EvalWork, not the books
        training_finished = on_finished
        on_finished = lambda name, done: training_finished(name, holder["e"].on_finished(done))   # noqa: E731
    instances = [SimInstance(f"rollout{i}", cost, clock, on_finished, trace) for i in range(n_inst)]
    for i in instances:
        i.slots = cfg.max_batch or i.slots
        i.kv_capacity = cfg.kv_tokens or i.kv_capacity
        i.hv.limit = cfg.versions_per_instance
        i.offload_preempted = cfg.kv_offload
    ctl = holder["c"] = RolloutController(rcfg, instances, prompts, clock, trace)

    def colocation_check() -> None:
        if colocated and any(i.running or i.queue for i in instances):
            raise SimulationError("colocated mode started training while rollout was still generating")

    trainer = SimTrainer(ctl, cost, clock, train_gpus, trace, colocation_check)
    lendable = [SimInstance(f"elastic{i}", cost, clock, on_finished, trace)
                for i in range(train_gpus // cost.model.tp if cfg.elastic and not colocated else 0)]
    for i in lendable:
        i.slots = cfg.max_batch or i.slots
        i.hv.limit = cfg.versions_per_instance
        i.offload_preempted = cfg.kv_offload
    elastic = ElasticDevices(ctl, cost, clock, train_gpus, lendable)
    trainer.blocked = elastic.blocked
    evals = None
    if cfg.eval_every and cfg.eval_prompts:
        evals = holder["e"] = SimEvals(ctl, workload, cfg.eval_every, cfg.eval_prompts, cfg.seed)
        trainer.before_publish = evals.published
        for i in instances + lendable:
            i.eval_aborted = evals.on_aborted
    return _Sim(cfg, cost, clock, ctl, trainer, instances, lendable, elastic, train_gpus, colocated, evals)


def _drive(sim: _Sim, warm: int) -> dict[str, float]:
    """Run the event loop until the last step; the busy snapshot at the end of step `warm`."""
    cfg, clock, ctl, trainer, elastic = sim.cfg, sim.clock, sim.ctl, sim.trainer, sim.elastic

    def tick() -> None:
        ctl.tick()
        clock.call_later(cfg.tick_s, tick)

    if sim.evals is not None:
        sim.evals.published(0)   # before training (sync: before the first batch)
    ctl.start()
    clock.call_later(cfg.tick_s, tick)
    snap = sim.busy_snapshot() if warm == 0 else {}
    last_step_t = 0.0
    while trainer.step < cfg.steps:
        if not clock.step():
            raise SimulationError(f"{cfg.mode}: event queue empty before step {trainer.step}")
        elastic.step(not (trainer.busy or trainer.publishing))
        trainer.maybe_start()
        if trainer.step_ends and trainer.step_ends[-1] > last_step_t:
            last_step_t = trainer.step_ends[-1]
            if trainer.step == warm and not snap:
                snap = sim.busy_snapshot()
        elif clock.now() - last_step_t > cfg.max_idle_sim_s:
            raise SimulationError(f"{cfg.mode}: no training step for {cfg.max_idle_sim_s:.0f} simulated seconds "
                                  f"(step {trainer.step}; in flight {ctl.manager.r_sum}, waiting {ctl.queue.waiting()})")
    return snap


def _results(sim: _Sim, warm: int, snap: dict[str, float], end: dict[str, float]) -> dict[str, Any]:
    """The mode's row: rates over the measured window (after `warm` steps) and the run's accounting."""
    cfg = sim.cfg
    summary = sim.ctl.finish()
    span = end["t"] - snap["t"]
    steps = cfg.steps - warm
    tokens = end["tokens"] - snap["tokens"]
    gpu_s = cfg.gpus * span
    busy = (end["roll_busy"] - snap["roll_busy"]) + (end["train"] - snap["train"])
    sm = sim.ctl.step_metrics
    stal = [m.staleness_max for m in sm]
    return {
        "mode": cfg.mode, "model": cfg.model, "gpus": cfg.gpus, "rollout_instances": len(sim.instances),
        "train_gpus": sim.train_gpus, "colocated": sim.colocated, "steps": cfg.steps, "warmup_steps": warm,
        "step_time_s": span / steps, "tokens_per_s": tokens / span,
        "rollout_only_fraction": (end["rollout_only"] - snap["rollout_only"]) / span,
        "bubble_fraction": max(0.0, 1 - busy / gpu_s),       # idle device-time / device-time, every device
        "overhead_fraction": (end["overhead"] - snap["overhead"]) / gpu_s,
        "staleness_max": max(stal), "staleness_mean": sum(m.staleness_mean for m in sm) / len(sm),
        "c1_violations": summary["c1_violations"], "c2_violations": summary["c2_violations"],
        "c3_violations": summary["c3_violations"],
        "versions_live_max": max(m.versions_live for m in sm),
        "migrated_requests": summary["migrated_requests"], "fast_lane_requests": summary["fast_lane_requests"],
        "siblings_started_newest": summary["siblings_started_newest"],
        "reprefill_tokens": summary["reprefill_tokens"],
        "weight_loads": summary["weight_loads"], "rebalances": summary["rebalances"],
        "total_time_s": end["t"], "trajectories_trained": summary["trained"],
        "in_flight_at_end": summary["in_flight_at_end"], "finished_untrained": summary["finished_untrained"],
        "lost": summary["lost"], "dropped": summary["dropped"], "elastic": bool(sim.lendable),
        "elastic_lends": sim.elastic.lends, "preemptions": sum(i.preemptions for i in sim.instances + sim.lendable),
        "per_step": [m.to_dict() for m in sm], **(sim.evals.results() if sim.evals is not None else {}),
    }
