"""Shared by the end-to-end tests (tests/test_e2e_*.py): run a pipeline through `dora run`
in-process and audit what the run left in its folder.

A run folder holds metrics.jsonl (one line per step), summary.json (accounting of every
dispatched trajectory), trace.json (Chrome trace), trained.jsonl (the trainer's own list of
the uids it trained per step) and checkpoints/step_N. The audits below check each against the
others, so a trajectory lost, trained twice, split from its group or too stale shows up.
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"

# Short-run overrides: small batches, short responses, tiny per-replica batches so requests
# queue and the orchestrator has work to do.
SHORT = ["nodes.rollout.params.max_tokens=48", "nodes.rollout.params.max_batch=4"]


# The shipped pipelines evaluate held-out sets; tests of other things run without them (the suite's
# time), tests/test_eval.py and the slow quickstart test with them.
NO_EVAL = ["eval=null", "run.keep_best=null"]


def dora_run(out: Path, pipeline: str | Path, *overrides: str, deadline: float = 300.0, evaluate: bool = False) -> int:
    """`dora run PIPELINE OVERRIDES --out OUT --quiet --deadline D`, in this process; the exit code.
    Without `evaluate` the pipeline's held-out sets are left out (NO_EVAL)."""
    from dora.rl.launch import run_main
    path = Path(pipeline)
    if not path.is_absolute() and not path.exists():
        path = PIPELINES / path
    extra = [] if evaluate else NO_EVAL
    return run_main([str(path), *extra, *overrides, "--out", str(out), "--quiet", "--deadline", str(deadline)])


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.files = self.path   # (its own files: trained.jsonl, length_trace.jsonl)
        self.summary = json.loads((self.path / "summary.json").read_text())
        self.metrics = [json.loads(line) for line in (self.path / "metrics.jsonl").read_text().splitlines() if line]
        ledger = self.path / "trained.jsonl"
        self.ledger = [json.loads(line) for line in ledger.read_text().splitlines() if line] if ledger.exists() else []

    @property
    def accounting(self) -> dict:
        return self.summary.get("accounting") or {}

    def describe(self) -> str:
        return f"{self.path}: ok={self.summary.get('ok')} error={self.summary.get('error')!r}"


class PolicyRunDir(RunDir):
    """One policy of a run of several, seen as a single-policy run folder: its lines of metrics.jsonl
    unprefixed, its part of summary.json (with the run's ok and error), its own trained.jsonl
    (RUN_DIR/policies/<update>/), so every audit above applies to it as it is."""

    def __init__(self, path: Path, policy: str):
        from dora.observe.metrics import policy_records
        super().__init__(path)
        self.policy, self.run_summary, self.lines = policy, self.summary, self.metrics
        self.summary = {**self.summary["policies"][policy], "ok": self.summary["ok"], "error": self.summary["error"]}
        self.metrics = policy_records(self.lines, policy)
        self.files = self.path / "policies" / policy
        ledger = self.files / "trained.jsonl"
        self.ledger = [json.loads(line) for line in ledger.read_text().splitlines() if line] if ledger.exists() else []


def check_metrics(run: RunDir, steps: int, train_batch: int) -> None:
    from dora.graph.builtin_ops import ENGINE_COUNTERS, ENGINE_GAUGES
    from dora.observe.metrics import REQUIRED_KEYS
    assert [r["step"] for r in run.metrics] == list(range(1, steps + 1)), run.describe()
    for r in run.metrics:
        missing = [k for k in REQUIRED_KEYS + ENGINE_COUNTERS + ENGINE_GAUGES if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        assert r["policy_version"] == r["step"]
        assert r["trajectories"] == train_batch, f"step {r['step']} trained {r['trajectories']} != {train_batch}"
        assert r["reward_mean"] is not None and 0.0 <= r["reward_mean"] <= 1.0
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and r["step_time_s"] > 0
        assert r["loss"] is not None and math.isfinite(r["loss"]), f"step {r['step']}: loss {r['loss']}"
        assert 0 <= r["fast_lane_requests"] <= r["migrated_requests"]
    check_length_trace(run)


def check_length_trace(run: RunDir) -> None:
    """RUN_DIR/length_trace.jsonl: a line per step metrics.jsonl has, with the trajectories it trained
    in whole groups (single-turn lengths add up to the step's tokens)."""
    lines = [json.loads(x) for x in (run.files / "length_trace.jsonl").read_text().splitlines() if x.strip()]
    assert [x["step"] for x in lines] == [r["step"] for r in run.metrics], run.describe()
    for x, r in zip(lines, run.metrics):
        assert sum(len(g["responses"]) for g in x["groups"]) == r["trajectories"]
        assert len({len(g["responses"]) for g in x["groups"]}) == 1, "groups of different sizes"
        if all(isinstance(n, int) for g in x["groups"] for n in g["responses"]):
            assert sum(g["prompt_tokens"] * len(g["responses"]) + sum(g["responses"]) for g in x["groups"]) == r["tokens"]


def check_accounting(run: RunDir, steps: int, train_batch: int) -> None:
    s, acc = run.summary, run.accounting
    assert s["ok"] is True and s["error"] is None, run.describe()
    assert s["steps"] == steps
    assert acc["lost"] == 0, acc
    assert acc["c2_violations"] == 0 and s["c2_violations"] == 0, acc
    assert acc["c3_violations"] == 0 and s["c3_violations"] == 0, acc
    assert acc["trained"] == steps * train_batch, acc
    # every dispatched trajectory is somewhere
    assert acc["dispatched"] == (acc["trained"] + acc["finished_untrained"] + acc["in_flight_at_end"]
                                 + acc["in_training_at_end"] + acc["dropped"]), acc


def check_ledger(run: RunDir, steps: int, train_batch: int, group_size: int, max_staleness: int) -> list[str]:
    """The trainer's record: each uid trained once, whole groups per step, staleness <= K.
    Returns every trained uid."""
    assert [e["step"] for e in run.ledger] == list(range(1, steps + 1)), run.describe()
    seen: collections.Counter[str] = collections.Counter()
    for e in run.ledger:
        uids, versions = e["uids"], e["policy_versions"]
        assert len(uids) == len(versions) == train_batch, f"step {e['step']}: {len(uids)} trajectories"
        seen.update(uids)
        groups = collections.Counter(u.rsplit("-", 1)[0] for u in uids)
        split = {g: n for g, n in groups.items() if n != group_size}
        assert not split, f"step {e['step']} trained partial groups {split} (group_size {group_size})"
        trainer_version = e["version"] - 1
        stale = [trainer_version - v for v in versions]
        assert min(stale) >= 0, f"step {e['step']}: trajectory from a future version {max(versions)}"
        assert max(stale) <= max_staleness, f"step {e['step']}: staleness {max(stale)} > K={max_staleness}"
    twice = [u for u, n in seen.items() if n > 1]
    assert not twice, f"trained more than once: {twice[:5]}"
    assert sum(seen.values()) == run.accounting["trained"]
    return list(seen)


def check_trace(run: RunDir) -> None:
    trace = json.loads((run.path / "trace.json").read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list)
    for ev in events:
        assert ev["ph"] in ("X", "i", "M", "B", "E", "C"), ev
        if ev["ph"] in ("X", "i"):
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert ev["dur"] >= 0, ev
    rollout_spans = [e for e in events if e["ph"] == "X" and e.get("cat") == "rollout"]
    assert rollout_spans, "trace.json has no rollout spans"
    assert any(e["name"].startswith("v") for e in rollout_spans)
    assert any(e["ph"] == "X" and e.get("cat") == "trainer" for e in events), "trace.json has no trainer steps"


def spans_by_row(run: RunDir) -> dict[str, list[tuple[float, float, dict]]]:
    """The trace's complete spans by row name (thread name) -> (start, end, event)."""
    events = json.loads((run.path / "trace.json").read_text())["traceEvents"]
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    out: dict[str, list] = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault(rows[(e["pid"], e["tid"])], []).append((e["ts"], e["ts"] + e["dur"], e))
    return out
