"""Arrow rows as ops pass them on: required columns, concatenation, one batch, a typed column set.
No torch here: ops that only move rows (dataset, reward, filter) start without importing it."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from dora.graph.columns import arrow_type


def require_columns(batch: pa.RecordBatch | pa.Table, names: Sequence[str], where: str) -> None:
    missing = [n for n in names if n not in batch.schema.names]
    if missing:
        raise ValueError(f"{where}: input batch lacks column(s) {missing}; it has {batch.schema.names}")


def concat_rows(batches: Sequence[pa.RecordBatch | pa.Table]) -> pa.Table:
    """One table of all rows; schemas are unified (a column missing in one batch becomes null there)."""
    tables = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b]) for b in batches]
    return pa.concat_tables(tables, promote_options="default")


def to_batch(table: pa.Table) -> pa.RecordBatch:
    """A table as a single RecordBatch (the unit on the wire)."""
    table = table.combine_chunks()
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]


def with_column(batch: pa.RecordBatch, name: str, values: list[Any]) -> pa.RecordBatch:
    """batch with column `name` set (added or replaced) to values, typed as in dora.graph.columns."""
    array = pa.array(values, type=arrow_type(name))
    field = pa.field(name, array.type)
    if name in batch.schema.names:
        return batch.set_column(batch.schema.get_field_index(name), field, array)
    return batch.append_column(field, array)
