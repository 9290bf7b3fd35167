"""Read the records of an offline W&B run (RUN_DIR/wandb/offline-run-*/run-*.wandb) back, for the
tests: the file is W&B's LevelDB-style log (a 7-byte header ":W&B", magic, version; then 32 KiB
blocks of chunks: crc32c (4), length (2), type (1: full, 2: first, 3: middle, 4: last)),
each record a `wandb.proto.wandb_internal_pb2.Record`."""

from __future__ import annotations

import glob
import json
import os
import struct

BLOCK = 32 * 1024
HEADER = 7


def records(path: str) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, buf, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:                      # block trailer: too short for a chunk header
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:     # zero padding
            pos += left - 7
            continue
        buf += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def history(run_dir: str) -> list[dict]:
    """Each logged step as {key: value} (W&B's own keys _step, _runtime, _timestamp included)."""
    files = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {run_dir}/wandb, found {files}"
    rows = []
    for rec in records(files[0]):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows
