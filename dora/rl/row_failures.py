"""Rows an op could not handle and reported instead of failing the run: counted per step and per run.

`reward_errors` (a reward function raised under on_error zero / skip), `dataset_skipped` (bad file
rows under on_error skip) and a judge's `judge_errors` events (unparseable verdicts, timeouts,
server errors; per step as metrics judge_<kind>, reset at each step's line)."""

from __future__ import annotations

from typing import Any

from dora.graph.builtin_ops import JUDGE_ERRORS


class RowFailures:
    KINDS = ("reward_errors", "dataset_skipped", "judge_errors")

    def __init__(self, judged: bool):
        self.bad_rows = {"reward_errors": 0, "dataset_skipped": 0}
        self.judged = judged    # a judge node in the graph: its counters are in every step line
        self.step = dict.fromkeys(JUDGE_ERRORS, 0)
        self.total = dict.fromkeys(JUDGE_ERRORS, 0)

    def add(self, kind: str, ev: dict[str, Any]) -> None:
        if kind == "judge_errors":
            for k in JUDGE_ERRORS:
                self.step[k] += int(ev.get(k) or 0)
                self.total[k] += int(ev.get(k) or 0)
        else:
            self.bad_rows[kind] += len(ev["uids"]) if "uids" in ev else int(ev.get("rows") or 0)

    def take_step(self) -> dict[str, int]:
        """The judge's failures since the last step (none without a judge node)."""
        if not self.judged:
            return {}
        out = {f"judge_{k}": n for k, n in self.step.items()}
        self.step = dict.fromkeys(JUDGE_ERRORS, 0)
        return out

    def totals(self) -> dict[str, int]:
        """For summary.json's accounting."""
        out = {"reward_errors": self.bad_rows["reward_errors"], "dataset_skipped_rows": self.bad_rows["dataset_skipped"]}
        if self.judged:
            out.update({f"judge_{k}": n for k, n in self.total.items()})
        return out
