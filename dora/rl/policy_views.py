"""What one policy of a run of several sees of the run's shared outputs (dora/rl/policies_driver.py):
each RLDriver writes to these as it would to the run's own, and the policy's name goes on everything.

    PolicyMetrics   metrics.jsonl: {"policy": U, "step": n, "U/<key>": value, ...} (every key but step
                    prefixed, so TensorBoard and W&B, which log each key at its step, show U/reward_mean)
    PolicyProgress  the progress output: status lines and steps labelled with U
    PolicyTrace     trace.json: the rows of the trainer and orchestrator processes under "U <row>" (the
                    rollout rows are generate replica names, which no two policies share)
"""

from __future__ import annotations

from typing import Any, Callable


class PolicyMetrics:
    def __init__(self, log, policy: str):
        """`log`: the run's MetricsLog."""
        self.log, self.policy = log, policy

    @property
    def path(self) -> str:
        return self.log.path

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.log.records

    def write(self, record: dict[str, Any]) -> None:
        p = self.policy
        self.log.write({"policy": p, "step": record["step"],
                        **{f"{p}/{k}": v for k, v in record.items() if k != "step"}})

    def write_samples(self, rows: list[dict[str, Any]]) -> None:   # (samples.jsonl's lines say their policy)
        self.log.write_samples([{"policy": self.policy, **r} for r in rows])

    def restart_at(self, cut: Callable[[], list[dict[str, Any]]]) -> None:
        self.log.restart_at(cut)


class PolicyProgress:
    def __init__(self, progress, policy: str, total: int):
        """`progress`: the run's RunProgress (its bar counts every policy's steps)."""
        self.progress, self.policy, self.total = progress, policy, total
        self.done = 0

    def status(self, text: str) -> None:
        self.progress.status(f"{self.policy}: {text}")

    def step(self, rec: dict[str, Any]) -> None:
        self.done = int(rec["step"])
        self.progress.step(rec, label=f"{self.policy} {self.done}/{self.total}", advance=1)


class PolicyTrace:
    def __init__(self, trace, policy: str):
        """`trace`: the run's TraceWriter."""
        self.trace, self.policy = trace, policy

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.trace.events

    @property
    def enabled(self) -> bool:
        return self.trace.enabled

    def _row(self, process: str, row: str) -> str:
        return row if process == "rollout" else f"{self.policy} {row}"

    def span(self, process: str, row: str, name: str, start: float, end: float, **args: Any) -> None:
        self.trace.span(process, self._row(process, row), name, start, end, policy=self.policy, **args)

    def instant(self, process: str, row: str, name: str, t: float, **args: Any) -> None:
        self.trace.instant(process, self._row(process, row), name, t, policy=self.policy, **args)

    def write(self, path: str) -> None:
        self.trace.write(path)
