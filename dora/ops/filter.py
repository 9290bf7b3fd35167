"""Filter op. kind "dapo_dynamic" (DAPO's dynamic sampling): drop every prompt group whose
rewards are all equal - its group-relative advantages are all zero, so it would only dilute
the batch. Whole groups only (C2: a group is kept or dropped entirely, never split).

Rows wait in a GroupBuffer until their group is whole (see dora.ops.group_buffer). Each drop is
reported: ctx.report({"kind": "filtered", "node", "groups": n, "group_ids": [...], "uids": [...]}),
and counted in stats().
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from dora.ops.base import OpContext, Operator
from dora.ops.arrow_rows import require_columns
from dora.ops.group_buffer import GroupBuffer

# rewards closer than this count as equal (float32 rewards computed by different code paths)
_EQUAL_TOL = 1e-6


class FilterOp(Operator):
    control_methods = ("stats",)

    def setup(self, ctx: OpContext) -> None:
        super().setup(ctx)
        self.kind = ctx.params["kind"]
        self.groups = GroupBuffer(ctx.async_.group_size, ctx.label)
        self.groups_seen = self.groups_filtered = self.rows_filtered = 0

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        require_columns(batch, ["group_id", "reward"], self.ctx.label)
        ready = self.groups.add(batch)
        return self._filter(ready) if ready is not None else []

    def finish(self) -> Iterable[pa.RecordBatch]:
        rest = self.groups.drain()
        return self._filter(rest) if rest is not None else []

    def _filter(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        gids = batch.column("group_id").to_pylist()
        rewards = batch.column("reward").to_pylist()
        by_group: dict[int, list[float]] = {}
        for g, r in zip(gids, rewards):
            by_group.setdefault(g, []).append(float("nan") if r is None else r)
        drop = [g for g, rs in by_group.items() if max(rs) - min(rs) <= _EQUAL_TOL]
        self.groups_seen += len(by_group)
        if not drop:
            return [batch]
        dropped = pc.is_in(batch.column("group_id"), value_set=pa.array(drop, pa.int64()))
        gone = batch.filter(dropped)
        uids = gone.column("uid").to_pylist() if "uid" in gone.schema.names else []
        self.groups_filtered += len(drop)
        self.rows_filtered += gone.num_rows
        self.ctx.report({"kind": "filtered", "node": self.ctx.node, "groups": len(drop), "group_ids": drop, "uids": uids})
        kept = batch.filter(pc.invert(dropped))
        return [kept] if kept.num_rows else []

    def stats(self) -> dict:
        return {"groups_seen": self.groups_seen, "groups_filtered": self.groups_filtered, "rows_filtered": self.rows_filtered}
