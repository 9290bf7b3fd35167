"""Per-step metrics: metrics.jsonl (one JSON object per training step) and summary.json.

The keys listed in REQUIRED_KEYS are a contract other tools rely on (see DESIGN.md):
every step record carries them, filled with 0 / None only where a mode does not measure them.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
from typing import Any, Callable

REQUIRED_KEYS = (
    "step", "policy_version", "reward_mean", "staleness_max", "staleness_mean", "step_time_s",
    "rollout_only_s", "tokens", "tokens_per_s", "trajectories",
)


def clean_json(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every line parses everywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


EVAL_FILE, SAMPLES_FILE = "eval.jsonl", "samples.jsonl"
LATEST_SAMPLES = 50   # sample rows kept in memory for a live dashboard


class MetricsLog:
    """Appends step records to DIR/metrics.jsonl as they happen (a crash keeps what was written),
    and hands each to the `run.loggers` sinks (dora/observe/metric_sinks.py), if any. Beside it:
    DIR/eval.jsonl, one line per held-out evaluation (version, set), whose metrics the sinks get as
    eval/<set>/<metric> (`write_eval`), and DIR/samples.jsonl, what the model wrote and what it was
    scored, training and evaluation samples alike (`write_samples`; W&B gets them as a table).

    `earlier`: a resumed run's records of steps 1..N (already in the file, which it appends to):
    they count in `records` (the summary is the whole lineage's) and are replayed into the sinks,
    which a resume opens afresh (dora/rl/lineage.py)."""

    def __init__(self, run_dir: str, sinks: list[Any] | None = None, append: bool = False,
                 earlier: list[dict[str, Any]] | None = None, open_sinks: Callable[[], list[Any] | None] | None = None):
        """`open_sinks`: opens the sinks again (restart_at); none: a restart goes on without them."""
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.open_sinks = open_sinks
        self._start(list(earlier or []), list(sinks or []), "a" if append else "w")

    def _start(self, records: list[dict[str, Any]], sinks: list[Any], mode: str) -> None:
        self.records, self.sinks = records, sinks
        run_dir = os.path.dirname(self.path)
        self.evals = read_jsonl(os.path.join(run_dir, EVAL_FILE)) if mode == "a" else []   # (kept lines: replayed)
        self.latest_samples: collections.deque = collections.deque(maxlen=LATEST_SAMPLES)   # (the dashboard's)
        self._fh = open(self.path, mode, encoding="utf-8")
        self._eval_fh = open(os.path.join(run_dir, EVAL_FILE), mode, encoding="utf-8")
        self._samples_fh = open(os.path.join(run_dir, SAMPLES_FILE), mode, encoding="utf-8")
        if self.sinks and (self.records or self.evals):
            from dora.observe.metric_sinks import write_to
            for record in self.records:
                write_to(self.sinks, record)
            for record in self.evals:
                write_to(self.sinks, record, "write_eval")

    def restart_at(self, cut: Callable[[], list[dict[str, Any]]]) -> None:
        """Go back to an earlier step (a trainer restart): the file and the sinks are closed, `cut()`
        moves the lines after that step away and returns those kept; the file is then appended to,
        and the sinks start afresh from a replay of the kept records."""
        had_sinks = bool(self.sinks)
        self.close()
        records = cut()
        sinks = (self.open_sinks() or []) if had_sinks and self.open_sinks is not None else []
        self._start(records, sinks, "a")

    def write(self, record: dict[str, Any]) -> None:
        missing = [k for k in REQUIRED_KEYS if key_of(record, k) not in record]
        if missing:
            raise KeyError(f"metrics record for step {record.get('step')} lacks {missing}")
        record = clean_json(record)
        self.records.append(record)
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        if self.sinks:
            from dora.observe.metric_sinks import write_to
            write_to(self.sinks, record)

    def write_eval(self, record: dict[str, Any]) -> None:
        """One held-out evaluation's line of eval.jsonl (its `step` is the version evaluated)."""
        record = clean_json(record)
        self.evals.append(record)
        self._line(self._eval_fh, record)
        if self.sinks:
            from dora.observe.metric_sinks import write_to
            write_to(self.sinks, record, "write_eval")

    def write_samples(self, rows: list[dict[str, Any]]) -> None:
        """Lines of samples.jsonl: {kind: train | eval, step, version, prompt, response, reward, ...}."""
        if not rows:
            return
        rows = [clean_json(r) for r in rows]
        self.latest_samples.extend(rows)
        self._samples_fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        self._samples_fh.flush()
        if self.sinks:
            from dora.observe.metric_sinks import write_to
            write_to(self.sinks, rows, "write_samples")

    @staticmethod
    def _line(fh, record: dict[str, Any]) -> None:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()

    def close(self) -> None:
        for fh in (self._eval_fh, self._samples_fh):
            if not fh.closed:
                fh.close()
        if not self._fh.closed:
            self._fh.close()
        if self.sinks:
            from dora.observe.metric_sinks import close_sinks
            close_sinks(self.sinks)
            self.sinks = []


def key_of(record: dict[str, Any], key: str) -> str:
    """Where `key` is in a step record: `key`, or `<policy>/key` in a line of one policy of a run of
    several (a line that says `"policy": P`; its `step` is P's step and stays unprefixed)."""
    policy = record.get("policy")
    return key if policy is None or key in ("step", "policy") else f"{policy}/{key}"


def policy_names(records: list[dict[str, Any]]) -> list[str]:
    """The policies of a run of several, in the order their first lines came (none: a single-policy run)."""
    return list(dict.fromkeys(r["policy"] for r in records if isinstance(r.get("policy"), str)))


def policy_records(records: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """One policy's lines of a multi-policy metrics.jsonl, its keys unprefixed (as a single-policy run's)."""
    prefix = f"{policy}/"
    return [{"step": r["step"], **{k[len(prefix):]: v for k, v in r.items() if k.startswith(prefix)}}
            for r in records if r.get("policy") == policy]


def summarize(records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """What a person wants after a run: how far reward moved, how fast, how stale, any violations."""
    out: dict[str, Any] = dict(extra)
    out["steps"] = len(records)
    if not records:
        return out
    rewards = [r["reward_mean"] for r in records if r.get("reward_mean") is not None]
    k = min(3, len(rewards))
    if rewards:
        out["reward_first3"] = statistics.fmean(rewards[:k])
        out["reward_last3"] = statistics.fmean(rewards[-k:])
        out["reward_gain"] = out["reward_last3"] - out["reward_first3"]
        out["reward_by_step"] = rewards
    tokens = sum(r.get("tokens") or 0 for r in records)
    wall = sum(r.get("step_time_s") or 0.0 for r in records)
    out["tokens"] = tokens
    out["train_time_s"] = wall
    out["tokens_per_s"] = tokens / wall if wall > 0 else None
    out["trajectories"] = sum(r.get("trajectories") or 0 for r in records)
    out["staleness_max"] = max((r.get("staleness_max") or 0) for r in records)
    out["rollout_only_s"] = sum(r.get("rollout_only_s") or 0.0 for r in records)
    out["rollout_only_fraction"] = out["rollout_only_s"] / wall if wall > 0 else None
    for key in ("c1_violations", "c2_violations", "c3_violations", "migrated_requests", "fast_lane_requests", "reprefill_tokens"):
        out[key] = sum(r.get(key) or 0 for r in records)
    return clean_json(out)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a jsonl file (none if it is missing; a torn last line is skipped)."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def write_summary(run_dir: str, summary: dict[str, Any]) -> str:
    path = os.path.join(run_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(clean_json(summary), fh, indent=2, sort_keys=True)
        fh.write("\n")
    return path
