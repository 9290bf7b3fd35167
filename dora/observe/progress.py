"""What a person watching `dora run` sees: a live bar (step, reward, tokens/s, staleness, ETA)
and a summary table at the end. Falls back to one plain line per step when not on a terminal,
so CI logs stay readable."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class RunProgress:
    def __init__(self, total_steps: int, title: str, quiet: bool = False):
        self.console = Console(stderr=True)
        self.total = total_steps
        self.quiet = quiet
        self.completed = 0
        self.live = self.console.is_terminal and not quiet
        self._progress = None
        if self.live:
            self._progress = Progress(
                TextColumn(f"[bold]{title}[/]"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=False,
            )
            self._task = self._progress.add_task(title, total=total_steps, info="starting workers...")
            self._progress.start()

    def status(self, text: str) -> None:
        if self.live:
            self._progress.update(self._task, info=text)
        elif not self.quiet:
            self.console.print(text)

    def step(self, rec: dict[str, Any], label: str | None = None, advance: int | None = None) -> None:
        """A training step. In a run of several policies each policy's steps come `label`led ("solver
        3/30") and `advance` the bar, which counts every policy's steps."""
        info = (f"reward {rec.get('reward_mean') or 0.0:.3f}  {rec.get('tokens_per_s') or 0.0:,.0f} tok/s  "
                f"stale<= {rec.get('staleness_max', 0)}  v{rec.get('policy_version')}")
        self.completed = self.completed + advance if advance is not None else rec["step"]
        where = label or f"{rec['step']}/{self.total}"
        if self.live:
            self._progress.update(self._task, completed=self.completed, info=f"{label}: {info}" if label else info)
        elif not self.quiet:
            print(f"step {where}  {info}  {rec.get('step_time_s', 0.0):.2f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary_table(self, summary: dict[str, Any]) -> None:
        if self.quiet:
            return
        table = Table(title="run summary", show_header=False)
        rows = [
            ("steps", summary.get("steps")), ("mode", summary.get("mode")),
            ("reward first 3 -> last 3", _pair(summary.get("reward_first3"), summary.get("reward_last3"))),
            ("tokens/s (train wall)", _num(summary.get("tokens_per_s"))),
            ("wall time (s)", _num(summary.get("wall_s"))),
            ("rollout-only fraction", _num(summary.get("rollout_only_fraction"))),
            ("staleness max", summary.get("staleness_max")),
            ("C1/C2/C3 violations", f"{summary.get('c1_violations', 0)}/{summary.get('c2_violations', 0)}/{summary.get('c3_violations', 0)}"),
            ("migrated requests", summary.get("migrated_requests")),
            ("run dir", summary.get("run_dir")),
        ]
        for u, part in (summary.get("policies") or {}).items():   # a run of several policies: each one's
            rows.insert(-1, (f"{u}: steps, reward first 3 -> last 3",
                             f"{part.get('steps')}, {_pair(part.get('reward_first3'), part.get('reward_last3')) or '-'}"))
        for k, v in rows:
            table.add_row(k, "-" if v is None else str(v))
        self.console.print(table)


def _num(x: Any) -> str | None:
    return None if x is None else f"{x:,.3f}" if isinstance(x, float) else str(x)


def _pair(a: Any, b: Any) -> str | None:
    return None if a is None or b is None else f"{a:.3f} -> {b:.3f}"
