"""One line of metrics.jsonl: what a training step trained and what rollout did meanwhile.

Built by the RL driver from the trainer's `train_step` event, the batch it sent, and the rollout
controller's StepMetrics of that step. The keys DESIGN.md lists are a contract (see
dora/observe/metrics.py, REQUIRED_KEYS); the trainer's own metrics join under their names (or
`train/<name>` where a name is taken)."""

from __future__ import annotations

from typing import Any

from dora.graph.builtin_ops import ENGINE_COUNTERS, ENGINE_GAUGES
from dora.graph.columns import SOURCE_PREFIX


def step_record(*, step: int, version: int, sent: dict[str, Any], sm: dict[str, Any], ev: dict[str, Any],
                wall_s: float, counters: dict[str, Any], weight_sync: tuple[Any, Any],
                extra: dict[str, Any]) -> dict[str, Any]:
    """`sent`: the batch as the driver sent it (uids, reward_mean, tokens, response_tokens); `sm`: the
    rollout controller's StepMetrics as a dict; `counters`: run-wide counts to stamp on the line;
    `extra`: more of the step's metrics (elastic lending's)."""
    step_time = float(sm.get("step_time_s") or 0.0) or 1e-9
    lengths = sorted(sent["response_tokens"]) or [0]
    rec = {   # (key order is the order of metrics.jsonl's columns)
        "step": step, "policy_version": version, "reward_mean": sent["reward_mean"], **sent.get("sources", {}),
        "staleness_max": sm.get("staleness_max", 0), "staleness_mean": sm.get("staleness_mean", 0.0),
        "step_time_s": step_time, "rollout_only_s": sm.get("rollout_only_s", 0.0), "tokens": sent["tokens"],
        "tokens_per_s": sent["tokens"] / step_time, "trajectories": len(sent["uids"]),
        "c1_violations": sm.get("c1_violations", 0), "c2_violations": sm.get("c2_violations", 0),
        "c3_violations": sm.get("c3_violations", 0), "versions_live": sm.get("versions_live", 0),
        "migrated_requests": sm.get("migrated_requests", 0), "fast_lane_requests": sm.get("fast_lane_requests", 0),
        "reprefill_tokens": sm.get("reprefill_tokens", 0),
        "weight_loads": sm.get("weight_loads", 0), **{k: sm.get(k, 0) for k in ENGINE_COUNTERS + ENGINE_GAUGES},
        "response_len_max": lengths[-1],
        "response_len_median": lengths[len(lengths) // 2], "train_s": ev.get("seconds"),
        "wall_s": wall_s, **counters,
        "weight_sync_s": weight_sync[0], "weight_sync_bytes": weight_sync[1], **extra,
    }
    for pool, frac in (sm.get("idle_fraction") or {}).items():
        rec[f"idle_fraction_{pool}"] = frac
    return rec


def driver_step_record(d, step: int, version: int, sent: dict[str, Any], ev: dict[str, Any], now: float) -> dict[str, Any]:
    """The line of RLDriver `d` for the step its trainer just reported (`ev`), the rollout
    controller's StepMetrics of that step and run-wide counters included."""
    sm = d.rc.step_metrics[-1].to_dict() if d.rc.step_metrics else {}
    counters = {"wire_rejected": d.ctrl.rejected(), "respawns": d.respawns,
                "reissued_requests": d.prompts.reissued_requests, "trainer_restarts": d.restarts.count}
    counters.update(d.row_failures.take_step())   # a judge's failures since the last step
    rec = step_record(step=step, version=version, sent=sent, sm=sm, ev=ev, wall_s=now, counters=counters,
                      weight_sync=d.weight_sync.get(version, (None, None)),
                      extra={**(d.elastic.step_metrics() if d.elastic is not None else {}),
                             **(d.shared.step_metrics() if d.shared is not None else {})})
    add_trainer_metrics(rec, ev.get("metrics") or {})
    return rec


def write_step(d, step: int, version: int, sent: dict[str, Any], ev: dict[str, Any], now: float) -> dict[str, Any]:
    """The step's line (metrics.jsonl and the loggers), its lengths (length_trace.jsonl), its sample of
    trajectories (samples.jsonl) and the progress line, for RLDriver `d`; returns the line."""
    rec = driver_step_record(d, step, version, sent, ev, now)
    d.multiturn.step_trained(step, sent)   # RUN_DIR/length_trace.jsonl
    d.metrics.write(rec)
    d.metrics.write_samples([{"kind": "train", "step": step, **row} for row in sent.get("samples", [])])
    d.progress.step(rec)
    return rec


def add_trainer_metrics(rec: dict[str, Any], metrics: dict[str, Any]) -> None:
    """The trainer's own metrics, under their names, or `train/<name>` where the name is taken."""
    for k, v in metrics.items():
        rec.setdefault(f"train/{k}" if k in rec else k, v)


def source_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The batch mean of each reward source's column reward/<name> (a reward node's sources, a scorer's column)."""
    names = sorted({k for r in rows for k in r if k.startswith(SOURCE_PREFIX)})
    out = {}
    for name in names:
        values = [float(r[name]) for r in rows if r.get(name) is not None]
        if values:
            out[name] = sum(values) / len(values)
    return out


def batch_summary(uids: list[str], rows: list[dict[str, Any]], sent_at: float) -> dict[str, Any]:
    """What the driver remembers of a batch it sent to the trainer (for the step's record)."""
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    return {"uids": uids, "sent_at": sent_at, "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "sources": source_means(rows),
            "tokens": sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows),
            "response_tokens": [len(r["response_ids"]) for r in rows],
            "lengths": [(str(r["uid"]), str(r.get("group_id")), len(r["prompt_ids"]), len(r["response_ids"]))
                        for r in rows]}   # (RUN_DIR/length_trace.jsonl: dora/rl/length_trace.py)


SAMPLE_FIELDS = ("uid", "prompt", "response_text", "final_turn_text", "reward", "policy_version", "finish_reason")


def sample_rows(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """`n` rows of a batch, evenly spread over it, as samples.jsonl keeps them (what the model wrote,
    what it was scored)."""
    if n <= 0 or not rows:
        return []
    picked = rows[::max(1, len(rows) // n)][:n]
    out = []
    for r in picked:
        s = {k: r.get(k) for k in SAMPLE_FIELDS if k in r}
        s["response"] = s.pop("response_text", None)
        s["version"] = s.pop("policy_version", None)
        s["response_tokens"] = len(r.get("response_ids") or [])
        out.append(s)
    return out
