"""Routing: which consumer replica gets which rows of an output batch.

- round_robin: whole batches, to replicas in turn.
- least_loaded: whole batches, to the replica with the fewest unacknowledged batches
  (i.e. the most credits left), ties to the lowest index.
- hash:COLUMN: rows split by a stable hash of COLUMN; one sub-batch per replica that gets rows.
- group_by: COLUMN: the same split as hash:COLUMN. Every producer replica uses the same stable
  hash, so all rows of a group reach the same consumer replica whichever producer replica
  they come from. Knowing when a group is complete is the consumer op's job (it knows the
  group size, e.g. the advantage op buffers G rows per group_id).

The hash must agree across processes, so Python's salted hash() is not used: integers go
through a multiplicative (Fibonacci) hash, everything else through crc32 of its UTF-8 text.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def parse(routing: str, group_by: str | None) -> tuple[str, str | None]:
    """(mode, column): mode is round_robin | least_loaded | hash."""
    if group_by:
        return "hash", group_by
    if routing.startswith("hash:"):
        return "hash", routing[len("hash:"):]
    if routing in ("round_robin", "least_loaded"):
        return routing, None
    raise ValueError(f"unknown routing {routing!r} (use round_robin, least_loaded or hash:COLUMN)")


def stable_hash(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """uint64 hash per value, identical in every process; nulls hash to 0."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
        v = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.uint64)
        return (v * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
    enc = pc.dictionary_encode(col)
    uniques = [zlib.crc32(str(x).encode()) if x is not None else 0 for x in enc.dictionary.to_pylist()]
    idx = pc.fill_null(enc.indices, 0).to_numpy(zero_copy_only=False) if len(uniques) else np.zeros(len(col), np.int64)
    table = np.asarray(uniques or [0], dtype=np.uint64)
    out = table[idx]
    if enc.indices.null_count:
        out[np.asarray(enc.indices.is_null())] = 0
    return out


def split_by_hash(batch: pa.RecordBatch, column: str, n: int) -> list[tuple[int, pa.RecordBatch]]:
    """(replica, sub-batch) for each replica that receives rows; row order kept within each."""
    if column not in batch.schema.names:
        raise KeyError(f"routing column {column!r} is not in the batch (columns: {batch.schema.names})")
    if n == 1:
        return [(0, batch)]
    target = (stable_hash(batch.column(column)) % np.uint64(n)).astype(np.int64)
    out = []
    for r in range(n):
        idx = np.flatnonzero(target == r)
        if len(idx):
            out.append((r, batch.take(pa.array(idx))))
    return out
