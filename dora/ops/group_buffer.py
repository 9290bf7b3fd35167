"""Hold rows until their prompt group is whole, so group-relative math sees all G responses.

group_size is the run's (ctx.async_.group_size: the dataset node's group_size, resolved once by
dora.graph.sections). A graph without a dataset node has none: the buffer then trusts its input,
taking each incoming batch to hold whole groups, which is what an edge with `group_by: group_id`
delivers.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from dora.ops.arrow_rows import concat_rows, to_batch


class GroupBuffer:
    def __init__(self, group_size: int | None, where: str):
        self.group_size = group_size
        self.where = where
        self.pending: pa.Table | None = None
        self.counts: Counter[int] = Counter()

    @property
    def pending_rows(self) -> int:
        return 0 if self.pending is None else self.pending.num_rows

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Rows of the groups that are now complete (in arrival order), or None."""
        if self.group_size is None:
            return batch if batch.num_rows else None
        gids = batch.column("group_id").to_pylist()
        self.counts.update(gids)
        over = [g for g in set(gids) if self.counts[g] > self.group_size]
        if over:
            raise ValueError(f"{self.where}: group_id(s) {sorted(over)[:5]} have more than group_size={self.group_size} rows")
        self.pending = concat_rows([self.pending, batch] if self.pending is not None else [batch])
        done = [g for g in set(gids) if self.counts[g] == self.group_size]
        if not done:
            return None
        is_done = pc.is_in(self.pending.column("group_id"), value_set=pa.array(done, pa.int64()))
        out = self.pending.filter(is_done)
        self.pending = self.pending.filter(pc.invert(is_done))
        for g in done:
            del self.counts[g]
        return to_batch(out)

    def drain(self) -> pa.RecordBatch | None:
        """Whatever incomplete groups remain (end of stream)."""
        if not self.pending_rows:
            return None
        out, self.pending = self.pending, None
        self.counts.clear()
        return to_batch(out)
