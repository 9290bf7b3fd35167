"""The base of a sharded op (update, critic, reference): its replicas are the ranks of one group.

Rank 0 is the op the runtime sees: it gets the data, and for work that needs every rank it calls
`spread(kind, header, table, tokens)`, which splits the rows by tokens (token_split), posts the
command with each rank's rows (an Arrow IPC stream) and returns rank 0's own share. Ranks 1..
are busy until rank 0 says "finish"; each poll runs the next command as `on_<kind>(header, cols)`.
Per-row results come back to rank 0 in row order with `collect(shards, values)`.
With one rank there is no group: spread returns every row, collect returns the values.
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from dora.ops.base import OpContext, Operator
from dora.ops.sharding import rank_group
from dora.ops.sharding.token_split import micro_batch_count, split_by_tokens

FOLLOWER_WAIT_S = 0.1   # ranks 1..: how long one poll waits for rank 0's next command


def table_bytes(table: pa.Table) -> bytes:
    """Rows as one Arrow IPC stream (what rank 0 sends another rank)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_columns(data: bytes) -> dict[str, list]:
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    return {c: table.column(c).to_pylist() for c in table.schema.names}


class ShardedOp(Operator):
    group: rank_group.RankGroup | None = None
    leader = True
    ranks = 1
    finished = False     # ranks 1..: rank 0 said the op is finished

    def join_group(self, ctx: OpContext) -> None:
        """Join this node's process group (none with one rank). Call first in setup."""
        self.group = rank_group.join(ctx)
        self.leader = self.group is None or self.group.leader
        self.ranks = 1 if self.group is None else self.group.world

    # ------------------------------------------------------------------ rank 0
    def spread(self, kind: str, header: dict[str, Any], table: pa.Table, tokens: list[int],
               budget: int) -> tuple[list[list[int]], dict[str, Any], dict[str, list]]:
        """Rank 0: (row indices per rank, the header with the aligned pass count, our own rows' columns)."""
        shards = split_by_tokens(tokens, self.ranks)
        header = {**header, "micro_batches": micro_batch_count(tokens, shards, budget)}
        if self.group is not None:
            self.group.post(kind, header, [table_bytes(table.take(s)) for s in shards[1:]])
        mine = table.take(shards[0]).to_pydict()
        return shards, header, mine

    def collect(self, shards: list[list[int]], values: list[list[float]]) -> list[list[float]] | None:
        """Every rank, with its rows' values: rank 0 gets every row's values in row order; others None."""
        if self.group is None:
            return values
        parts = self.group.gather_bytes(table_bytes(pa.table({"v": pa.array(values, pa.list_(pa.float32()))})))
        if parts is None:
            return None
        out: list[Any] = [None] * sum(len(s) for s in shards)
        for rows, part in zip(shards, parts):
            for i, v in zip(rows, table_columns(part)["v"]):
                out[i] = v
        return out

    def end_group(self) -> None:
        """Rank 0: tell ranks 1.. the op is finished (after its own last collective)."""
        if self.group is not None and self.leader and not self.finished:
            self.group.post("finish", {})
            self.finished = True

    # ------------------------------------------------------------------ ranks 1..
    def busy(self) -> bool:
        return not self.leader and not self.finished

    def poll(self) -> Iterable[pa.RecordBatch]:
        if self.leader:
            return ()
        cmd = self.group.next_command(FOLLOWER_WAIT_S)
        if cmd is None:
            return ()
        if cmd.kind == "finish":
            self.finished = True
            return ()
        handler = getattr(self, f"on_{cmd.kind}", None)
        if handler is None:
            raise ValueError(f"{self.ctx.label}: unknown command {cmd.kind!r} from rank 0")
        handler(cmd.header, table_columns(cmd.payload) if cmd.payload else {})
        return ()

    def teardown(self) -> None:
        if self.group is not None:
            try:   # let ranks 1.. leave their wait when a run stops without end-of-stream
                self.end_group()
            except Exception:
                pass
            self.group.close()
