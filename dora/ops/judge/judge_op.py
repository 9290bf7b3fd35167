"""The judge op: an LLM reads each trajectory through a rubric; its parsed verdict is the score.

Rows stream: process() hands each row to the backend (backends.EngineJudge on the project's
engines, or http_judge.HttpJudge) and returns at once; poll() collects verdicts and emits the
judged rows with the score in `column` (reward by default, or reward/<name> for a reward node's
sources). A replica holds at most `max_in_flight` rows under judgement: past that it takes no
input (`accepts_input`), its input edge's credits run out and a slow judge shows as back-pressure
on that edge, memory bounded by max_in_flight plus the edge's capacity.

Failures: a verdict that does not parse (verdicts.VerdictError), a timeout or a server error
(backends.JudgeFailure) follows `on_error`: fail raises naming the uid; zero scores the row 0;
skip drops its whole group (C2): rows are then emitted by whole groups only, a group with a
failed row is reported as {"kind": "filtered", "reason": "judge_error", ...} (the driver drops it
whole) and its other rows are dropped here. Every poll with failures reports
{"kind": "judge_errors", "node", "parse_errors", "timeouts", "server_errors", "uids", "errors"}
(the RL driver sums them per step: judge_parse_errors, judge_timeouts, judge_server_errors).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

import pyarrow as pa

from dora.graph.builtin_ops import JUDGE_ERRORS
from dora.ops.arrow_rows import require_columns
from dora.ops.base import OpContext, Operator
from dora.ops.judge.backends import JudgeFailure
from dora.ops.judge.verdicts import VerdictError, make_parser


FAILURE_KEYS = {"parse": "parse_errors", "timeout": "timeouts", "server": "server_errors"}   # -> JUDGE_ERRORS


class JudgeError(RuntimeError):
    """A row the judge could not score under on_error: fail (the message names the uid)."""


class JudgeOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        p = ctx.params
        self.column, self.on_error, self.max_in_flight = p["column"], p["on_error"], p["max_in_flight"]
        self.parse = make_parser(p["parser"], p["pattern"], p["range"], p["values"])
        if p["engine"] == "http":
            from dora.ops.judge.http_judge import HttpJudge
            self.backend = HttpJudge(ctx.label, p)
        else:
            from dora.ops.judge.backends import EngineJudge
            self.backend = EngineJudge(ctx, p)
        self.judging: dict[str, dict[str, Any]] = {}    # uid -> row, handed to the backend
        self.groups = WholeGroups(ctx.async_.group_size) if self.on_error == "skip" else None
        self.in_fields: dict[str, pa.Field] = {}
        self.counts = collections.Counter(dict.fromkeys(("judged", "groups_skipped", *JUDGE_ERRORS), 0))

    def accepts_input(self) -> bool:
        return len(self.judging) < self.max_in_flight

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["uid", "response_text"] + (["group_id"] if self.groups else []), self.ctx.label)
        for f in batch.schema:
            self.in_fields.setdefault(f.name, f)
        for row in batch.to_pylist():
            if self.groups is not None and not self.groups.arrived_row(row):
                continue   # its group already failed: dropped whole, nothing to judge
            uid = str(row["uid"])
            self.judging[uid] = row
            self.backend.submit(uid, row)
        return ()

    def busy(self) -> bool:
        return bool(self.judging)

    def poll(self) -> Iterable[pa.RecordBatch]:
        judged, failures = [], []
        for uid, verdict in self.backend.poll():
            row = self.judging.pop(uid)
            try:
                if isinstance(verdict, JudgeFailure):
                    raise verdict
                row[self.column] = self.parse(verdict)
            except (VerdictError, JudgeFailure) as e:
                kind = "parse" if isinstance(e, VerdictError) else e.kind
                if self.on_error == "fail":
                    raise JudgeError(f"{self.ctx.label}: the judge could not score uid {uid!r} ({kind}): {e}") from e
                failures.append((row, kind, str(e)))
                row[self.column] = 0.0
            judged.append(row)
        self.counts["judged"] += len(judged)
        if failures:
            self._report(failures)
        if self.groups is not None:
            judged = self.groups.judged(judged, failed={id(r) for r, _, _ in failures})
            for gid, uids in self.groups.take_failed():   # the driver drops each whole, members in flight too
                self.ctx.report({"kind": "filtered", "node": self.ctx.node, "reason": "judge_error", "groups": 1,
                                 "group_ids": [gid], "uids": uids})
                self.counts["groups_skipped"] += 1
        return [self._batch(judged)] if judged else ()

    def finish(self) -> Iterable[pa.RecordBatch]:
        rest = self.groups.drain() if self.groups is not None else []
        return [self._batch(rest)] if rest else ()

    def _report(self, failures: list[tuple[dict, str, str]]) -> None:
        kinds = collections.Counter(FAILURE_KEYS[kind] for _, kind, _ in failures)
        self.counts.update(kinds)
        self.ctx.report({"kind": "judge_errors", "node": self.ctx.node, **{k: kinds[k] for k in JUDGE_ERRORS},
                         "uids": [str(r["uid"]) for r, _, _ in failures], "errors": [m[:200] for _, _, m in failures[:5]]})

    def _batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        names = [n for n in self.in_fields if n != self.column]
        fields = [self.in_fields[n] for n in names] + [pa.field(self.column, pa.float32())]
        return pa.RecordBatch.from_pylist(rows, schema=pa.schema(fields))

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "in_flight": len(self.judging), **self.backend.stats()}

    def live_stats(self) -> dict[str, Any]:
        """For the dashboard: rows under judgement show as the replica's running work (`active`)."""
        stats = self.stats()
        return {**stats, "active": stats["in_flight"]}

    def teardown(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()


class WholeGroups:
    """on_error skip: judged rows wait for their group; a group with a failed row is dropped whole.

    A group is whole when group_size rows (the run's, ctx.async_.group_size) are judged or dropped;
    without a dataset node (None) when every row of its id that arrived so far is, as GroupBuffer
    takes each batch to hold whole groups. A failed group's id is kept until all its rows arrived,
    so its late rows are dropped without being judged."""

    def __init__(self, group_size: int | None):
        self.group_size = group_size
        self.arrived: collections.Counter[int] = collections.Counter()   # rows of each open group that arrived
        self.done: collections.Counter[int] = collections.Counter()      # ... judged or dropped
        self.waiting: dict[int, list[dict]] = collections.defaultdict(list)   # judged rows of clean groups
        self.failed: set[int] = set()
        self.newly_failed: list[tuple[int, list[str]]] = []

    def arrived_row(self, row: dict) -> bool:
        """Count a row in; False if its group has failed already (drop it)."""
        gid = int(row["group_id"])
        self.arrived[gid] += 1
        if gid in self.failed:
            self.done[gid] += 1
            self._close_if_whole(gid)
            return False
        return True

    def judged(self, rows: list[dict], failed: set[int]) -> list[dict]:
        """Rows of the groups now whole and clean, in order; failed groups are noted (take_failed)."""
        out = []
        for row in rows:
            gid = int(row["group_id"])
            self.done[gid] += 1
            if id(row) in failed and gid not in self.failed:
                self.failed.add(gid)
                self.newly_failed.append((gid, [str(r["uid"]) for r in self.waiting.pop(gid, [])] + [str(row["uid"])]))
            elif gid not in self.failed:
                self.waiting[gid].append(row)
                if self.done[gid] == self._expected(gid):
                    out += self.waiting.pop(gid)
            self._close_if_whole(gid)
        return out

    def take_failed(self) -> list[tuple[int, list[str]]]:
        out, self.newly_failed = self.newly_failed, []
        return out

    def drain(self) -> list[dict]:
        """At end of stream: the judged rows of clean groups still held (a group cut short upstream)."""
        out = [r for rows in self.waiting.values() for r in rows]
        self.waiting.clear()
        return out

    def _expected(self, gid: int) -> int:
        return self.group_size if self.group_size is not None else self.arrived[gid]

    def _close_if_whole(self, gid: int) -> None:
        if self.done[gid] >= self._expected(gid):
            for book in (self.arrived, self.done, self.waiting):
                book.pop(gid, None)
            self.failed.discard(gid)
