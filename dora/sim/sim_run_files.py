"""`dora simulate --out DIR`: a simulated run leaves the files a real run does, so `dora dashboard`
and `dora plot` read it the same way. One folder per mode: DIR/<mode>/ with

    metrics.jsonl   one line per training step (the rollout controller's StepMetrics; reward_mean
                    null: the simulator has no rewards; wall_s = simulated seconds at the step's end)
    summary.json    the mode's row of `dora simulate --json`, plus name, ok, source "simulate"
    trace.json      the Chrome/Perfetto trace of the simulated cluster
    state.json      the dashboard state: the simulated system drawn as a pipeline (prompts ->
                    rollout instances -> trainer, weights back), totals per edge, each instance's
                    state at the end, the version timeline, the step curves
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from dora.graph.builder import Pipeline
from dora.observe.dashboard.state import make_state, steps_section, write_state
from dora.observe.dashboard.timeline import timeline_of_trace
from dora.observe.metrics import MetricsLog, clean_json
from dora.observe.trace import TraceWriter


def system_graph(cfg: Any, result: dict[str, Any]):
    """What the simulator models, as a graph: a prompt source, the rollout instances (one TP group
    each), the trainer; a colocated run (sync) shares one pool."""
    n, tp_gpus, train = result["rollout_instances"], cfg.gpus - result["train_gpus"], result["train_gpus"]
    pools = ({"cluster": ("gpu", cfg.gpus)} if result["colocated"]
             else {"rollout": ("gpu", max(1, tp_gpus)), "train": ("gpu", train)})
    p = Pipeline(f"simulated {cfg.model} on {cfg.gpus} GPUs", pools=pools,
                 async_={"mode": cfg.mode, "max_staleness": cfg.max_staleness, "train_batch": cfg.train_batch,
                         "rollout_batch": cfg.rollout_batch or cfg.train_batch})
    prompts = p.node("prompts", "dataset", group_size=cfg.group_size)
    rollout = p.node("rollout", "generate", pool="cluster" if result["colocated"] else "rollout", replicas=n)
    train = p.node("train", "update", pool="cluster" if result["colocated"] else "train", steps=cfg.steps)
    prompts >> rollout >> train
    train.weights >> rollout.weights
    return p.graph


def write_sim_run(out_dir: str, cfg: Any, result: dict[str, Any], trace: TraceWriter, controller: Any,
                  trainer: Any, instances: list[Any]) -> str:
    from dora.graph.viz import figure

    os.makedirs(out_dir, exist_ok=True)
    records = _step_records(controller, trainer)
    log = MetricsLog(out_dir)
    for r in records:
        log.write(r)
    log.close()
    name = f"simulated {cfg.model} on {cfg.gpus} GPUs"
    summary = {k: v for k, v in result.items() if k != "per_step"}
    summary.update(name=name, ok=True, error=None, source="simulate", seed=cfg.seed, workload=cfg.workload)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(clean_json(summary), fh, indent=2, sort_keys=True)
    trace.write(os.path.join(out_dir, "trace.json"))

    graph = system_graph(cfg, result)
    fig = figure(graph)
    total = result["total_time_s"]
    finished = result["trajectories_trained"] + result["finished_untrained"] + result["dropped"]
    dispatched = finished + result["in_flight_at_end"]
    counts = {"prompts": (dispatched // max(1, cfg.group_size), dispatched), "rollout": (cfg.steps, finished)}
    edges = []
    for e in fig["edges"]:
        e = dict(e)
        if e["kind"] == "data":
            batches, rows = counts[e["src"]]
            e.update(batches=batches, rows=rows, bytes=None, batches_per_s=None, rows_per_s=None, mb_per_s=None,
                     queued=None, window=None)
        else:
            e.update(versions=trainer.version + 1, last_version=trainer.version, bytes=None, loads=result["weight_loads"])
        edges.append(e)
    replicas = []
    for i, inst in enumerate(instances):
        s = inst.stats()
        replicas.append({"name": inst.name, "node": "rollout", "replica": i, "op": "generate", "pool": None,
                         "device": "gpu", "pid": None, "state": "running" if s.active + s.queued else "waiting",
                         "version": inst.version, "step": None, "running": s.active, "queued": s.queued,
                         "kv_used": round(s.kv_used_fraction * inst.kv_capacity), "kv_capacity": inst.kv_capacity,
                         "generated_tokens": inst.tokens, "tokens_per_s": inst.tokens / total if total > 0 else None})
    replicas.append({"name": "train", "node": "train", "replica": 0, "op": "update", "pool": None, "device": "gpu",
                     "pid": None, "state": "finished", "version": trainer.version, "step": trainer.step, "running": None,
                     "queued": None, "kv_used": None, "kv_capacity": None, "generated_tokens": None, "tokens_per_s": None})
    run = {"name": name, "mode": cfg.mode, "max_staleness": cfg.max_staleness, "status": "finished",
           "source": "simulate", "elapsed_s": round(total, 3), "started_at": None, "updated_at": time.time(),
           "step": trainer.step, "total_steps": cfg.steps, "run_dir": os.path.abspath(out_dir), "error": None}
    timeline = timeline_of_trace(trace.to_json(), [i.name for i in instances])
    write_state(out_dir, make_state(run, fig, edges, replicas, timeline, steps_section(records)))
    return out_dir


def _step_records(controller: Any, trainer: Any) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(controller.step_metrics):
        d = m.to_dict()
        idle = d.pop("idle_fraction", {}) or {}
        # numbered from 1 like a real run's metrics.jsonl (step N produced version N)
        d.update(step=i + 1, reward_mean=None, tokens_per_s=d["tokens"] / d["step_time_s"] if d["step_time_s"] > 0 else None,
                 wall_s=trainer.step_ends[i] if i < len(trainer.step_ends) else None)
        d.update({f"idle_fraction_{pool}": f for pool, f in idle.items()})
        out.append(d)
    return out
