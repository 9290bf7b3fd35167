"""The wire format: what one message on a dora channel looks like, and how it is checked.

Data message = 3 zmq frames:
    frame 0: msgpack header {v, kind, edge, seq, batch_id, rows, schema_fp, versions, sender, nbytes}
    frames 1-2: the Arrow IPC stream of one batch, split at its message boundary:
             frame 1 the schema message, frame 2 the record batch message (nbytes = both)
             (split so the sender serializes the batch once into its own buffer and the
             receiver reuses a schema it has seen, byte-compared, instead of parsing it)
End-of-stream = 1 frame: a header with kind "eos" (rows 0, nbytes 0, no body).
Credit (consumer -> producer, on the same connection) = 1 frame: msgpack {kind: "credit", edge, n, bytes}.
Control message = frame 0 msgpack dict with a "kind" key, then optional raw binary frames
(tensor bytes; their dtype/shape travel in the dict, see `tensor_meta`).

Bodies are sent with copy=False and received as zmq Frames whose buffers go to Arrow
through `pa.py_buffer` without a copy. No pickle anywhere: headers and control messages are
msgpack of plain types only. The body carries no checksum (TCP/IPC already protect bytes in
transit); the checks catch what a buggy or hostile peer can send: unreadable or incomplete
headers, wrong types, truncated or oversized bodies, a schema that is not the one announced,
a row count that does not match, replayed or skipped sequence numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Sequence

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from dora.runtime.errors import WireError

VERSION = 1
#: largest body a receiver accepts (bytes); a bigger one is rejected before Arrow sees it
MAX_MESSAGE_BYTES = int(os.environ.get("DORA_MAX_MESSAGE_BYTES", 1 << 30))
#: header field -> accepted Python types (bool is excluded from ints explicitly below)
HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "v": (int,), "kind": (str,), "edge": (str,), "seq": (int,), "batch_id": (str,), "rows": (int,),
    "schema_fp": (int,), "versions": (list,), "sender": (str,), "nbytes": (int,),
}
_MAX_HEADER_BYTES = 64 << 10
_MAX_CONTROL_BYTES = 64 << 20


@dataclasses.dataclass
class Header:
    kind: str          # "batch" | "eos"
    edge: str
    seq: int
    batch_id: str
    rows: int
    schema_fp: int
    versions: list[int]
    sender: str
    nbytes: int

    def pack(self) -> bytes:
        return msgpack.packb({"v": VERSION, "kind": self.kind, "edge": self.edge, "seq": self.seq, "batch_id": self.batch_id,
                              "rows": self.rows, "schema_fp": self.schema_fp, "versions": self.versions,
                              "sender": self.sender, "nbytes": self.nbytes}, use_bin_type=True)


# ---------------------------------------------------------------- schema fingerprint

_fp_cache: list[tuple[pa.Schema, int]] = []


def schema_fp(schema: pa.Schema) -> int:
    """A stable 63-bit fingerprint of an Arrow schema (names, types, metadata)."""
    for s, fp in _fp_cache:  # a handful of schemas per process: a linear scan beats hashing
        if s is schema or s.equals(schema, check_metadata=True):
            return fp
    fp = int.from_bytes(hashlib.blake2b(schema.serialize().to_pybytes(), digest_size=8).digest(), "little") >> 1
    _fp_cache.append((schema, fp))
    del _fp_cache[:-16]
    return fp


def batch_versions(batch: pa.RecordBatch) -> list[int]:
    """The distinct policy_version values in a batch (empty if it has no such column)."""
    if batch.num_rows == 0 or batch.schema.get_field_index("policy_version") < 0:
        return []
    return sorted(v for v in pc.unique(batch.column("policy_version")).to_pylist() if v is not None)


# ---------------------------------------------------------------- data messages


_schema_msgs: dict[int, tuple[pa.Schema, bytes]] = {}   # fingerprint -> (schema, its IPC message)


def _schema_message(schema: pa.Schema) -> tuple[int, bytes]:
    fp = schema_fp(schema)
    if fp not in _schema_msgs:
        _schema_msgs[fp] = (schema, schema.serialize().to_pybytes())
    return fp, _schema_msgs[fp][1]


def encode_body(batch: pa.RecordBatch) -> list[Any]:
    """The Arrow IPC stream of one batch, split at its message boundaries: [schema message,
    record batch message]. Serializing the batch is the one copy on the send side; the schema
    message is cached per schema."""
    return [_schema_message(batch.schema)[1], batch.serialize()]


class SendBufferPool:
    """Reusable send buffers for large batches. Serializing a 16 MB batch into memory that is
    already mapped runs at memcpy speed; a fresh allocation per batch page-faults at a third of
    it. A buffer is reused only once zmq reports (MessageTracker) that it is done with it."""

    MIN_BYTES = 512 << 10   # smaller batches: batch.serialize() is as fast and simpler

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.free: list[pa.Buffer] = []
        self.busy: list[list[Any]] = []   # [buffer, tracker or None (not sent yet)]

    def get(self, size: int) -> list[Any]:
        sent = [e for e in self.busy if e[1] is not None and e[1].done]
        self.busy = [e for e in self.busy if not (e[1] is not None and e[1].done)]
        self.free.extend(e[0] for e in sent)
        self.free.sort(key=lambda b: b.size)
        buf = next((b for b in self.free if b.size >= size), None)
        if buf is not None:
            self.free.remove(buf)
        else:
            buf = pa.allocate_buffer(size + (1 << 20), resizable=False)
            del self.free[: max(0, len(self.free) - self.keep)]  # forget the smallest spares
        entry = [buf, None]
        self.busy.append(entry)
        return entry


def encode_body_pooled(batch: pa.RecordBatch, pool: SendBufferPool) -> tuple[list[Any], list[Any] | None]:
    """encode_body, into a pooled buffer for large batches: (body frames, pool entry or None).
    The caller stores the zmq MessageTracker in entry[1] when it sends."""
    if batch.nbytes < pool.MIN_BYTES // 2:  # cheap pre-check: most batches are small
        return encode_body(batch), None
    _, smsg = _schema_message(batch.schema)
    size = len(smsg) + pa.ipc.get_record_batch_size(batch) + 8
    if size < pool.MIN_BYTES:
        return encode_body(batch), None
    entry = pool.get(size)
    sink = pa.FixedSizeBufferWriter(entry[0])
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    end = sink.tell() - 8  # less the end-of-stream marker
    return [smsg, entry[0].slice(len(smsg), end - len(smsg))], entry


def body_size(body: list[Any]) -> int:
    return sum(len(b) if isinstance(b, bytes) else b.size for b in body)


def encode_batch(batch: pa.RecordBatch, edge: str, seq: int, sender: str, body: list[Any] | None = None) -> list[Any]:
    """Frames for one data message; pass `body` if already encoded (its size decided credits)."""
    body = encode_body(batch) if body is None else body
    h = Header("batch", edge, seq, f"{sender}:{edge}:{seq}", batch.num_rows, schema_fp(batch.schema),
               batch_versions(batch), sender, body_size(body))
    return [h.pack(), *body]


def encode_eos(edge: str, seq: int, sender: str) -> list[bytes]:
    return [Header("eos", edge, seq, f"{sender}:{edge}:eos", 0, 0, [], sender, 0).pack()]


def _bytes_of(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


_KEYS = frozenset(HEADER_TYPES)


def decode_header(frames: Sequence[Any]) -> Header:
    """Check the frame count and the header; raise WireError naming edge/sender when known."""
    if not 1 <= len(frames) <= 3:
        raise WireError(f"expected 1 or 3 frames, got {len(frames)}")
    raw = _bytes_of(frames[0])
    if len(raw) > _MAX_HEADER_BYTES:
        raise WireError(f"header of {len(raw)} bytes exceeds {_MAX_HEADER_BYTES}")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:
        raise WireError(f"unreadable header ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise WireError(f"header is a {type(d).__name__}, not a map")
    edge = d.get("edge") if isinstance(d.get("edge"), str) else "?"
    sender = d.get("sender") if isinstance(d.get("sender"), str) else "?"
    if d.keys() != _KEYS:
        missing, extra = sorted(_KEYS - set(d)), sorted(map(str, set(d) - _KEYS))
        raise WireError(f"header keys wrong (missing {missing}, unexpected {extra})", edge, sender)
    for k, types in HEADER_TYPES.items():
        v = d[k]
        if type(v) not in types:  # exact types: bool is not an int here
            raise WireError(f"header field {k!r} is {type(v).__name__}, expected {types[0].__name__}", edge, sender)
    if d.pop("v") != VERSION:
        raise WireError(f"wire version differs from this build's ({VERSION})", edge, sender)
    h = Header(**d)
    if h.kind not in ("batch", "eos"):
        raise WireError(f"unknown message kind {h.kind!r}", edge, sender)
    if any(type(v) is not int for v in h.versions):
        raise WireError("header field 'versions' must be a list of ints", edge, sender)
    if h.seq < 0 or h.rows < 0 or h.nbytes < 0:
        raise WireError(f"negative seq/rows/nbytes ({h.seq}, {h.rows}, {h.nbytes})", edge, sender)
    if h.batch_id != f"{h.sender}:{h.edge}:{h.seq if h.kind == 'batch' else 'eos'}":
        raise WireError(f"batch_id {h.batch_id!r} does not match sender, edge and sequence", edge, sender)
    want_frames = 1 if h.kind == "eos" else 3
    if len(frames) != want_frames:
        raise WireError(f"a {h.kind!r} message has {want_frames} frame(s), got {len(frames)}", edge, sender)
    if h.nbytes > MAX_MESSAGE_BYTES:
        raise WireError(f"body of {h.nbytes} bytes exceeds the limit of {MAX_MESSAGE_BYTES} (DORA_MAX_MESSAGE_BYTES)", edge, sender)
    return h


def decode_body(h: Header, frames: Sequence[Any]) -> pa.RecordBatch:
    """The record batch of a data message, zero-copy over the zmq frames; checks size and schema."""
    smv, bmv = _bytes_of(frames[0]), _bytes_of(frames[1])
    if len(smv) + len(bmv) != h.nbytes:
        raise WireError(f"body is {len(smv) + len(bmv)} bytes, header says {h.nbytes} (truncated or padded)", h.edge, h.sender)
    known = _schema_msgs.get(h.schema_fp)
    try:
        if known is not None and known[1] == smv:
            schema = known[0]  # the usual case: a schema seen before, byte for byte
        else:
            schema = pa.ipc.read_schema(pa.py_buffer(smv))
            if schema_fp(schema) != h.schema_fp:
                raise WireError("schema fingerprint mismatch: body schema is not the one the header announces", h.edge, h.sender)
            if len(_schema_msgs) > 256:  # a peer inventing schemas must not grow this forever
                _schema_msgs.clear()
            _schema_msgs[h.schema_fp] = (schema, bytes(smv))
        batch = pa.ipc.read_record_batch(pa.py_buffer(bmv), schema)
        batch.validate()  # buffer sizes vs lengths: Arrow must not read past the body
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"corrupt Arrow body ({type(e).__name__}: {str(e)[:200]})", h.edge, h.sender) from None
    if batch.num_rows != h.rows:
        raise WireError(f"body has {batch.num_rows} rows, header says {h.rows}", h.edge, h.sender)
    if batch_versions(batch) != h.versions:
        raise WireError(f"header versions {h.versions[:8]} differ from the body's policy_version values", h.edge, h.sender)
    return batch


# ---------------------------------------------------------------- credits and control


def encode_credit(edge: str, n: int, nbytes: int) -> bytes:
    return msgpack.packb({"kind": "credit", "edge": edge, "n": n, "bytes": nbytes}, use_bin_type=True)


def decode_credit(raw: Any) -> tuple[str, int, int]:
    d = decode_control([raw])[0]
    if d.get("kind") != "credit" or not isinstance(d.get("edge"), str) or not isinstance(d.get("n"), int) or not isinstance(d.get("bytes"), int):
        raise WireError(f"malformed credit message {d!r}"[:200])
    return d["edge"], d["n"], d["bytes"]


def encode_control(msg: dict[str, Any], buffers: Sequence[Any] = ()) -> list[Any]:
    """A control message: msgpack dict then raw buffers (sent without copies)."""
    return [msgpack.packb(msg, use_bin_type=True), *buffers]


def decode_control(frames: Sequence[Any]) -> tuple[dict[str, Any], list[memoryview]]:
    raw = _bytes_of(frames[0])
    if len(raw) > _MAX_CONTROL_BYTES:
        raise WireError(f"control message of {len(raw)} bytes exceeds {_MAX_CONTROL_BYTES}")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as e:
        raise WireError(f"unreadable control message ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        raise WireError("control message must be a map with a string 'kind'")
    return d, [_bytes_of(f) for f in frames[1:]]


@dataclasses.dataclass
class WithBuffers:
    """A control-call result (or argument) with raw binary parts, e.g. tensors; `value` must
    be msgpack-able and describe the buffers (see tensor_meta)."""

    value: Any
    buffers: list[Any]


def tensor_meta(t: Any) -> dict[str, Any]:
    """dtype/shape of a torch tensor or numpy array, to travel beside its raw bytes."""
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


def tensor_from(meta: dict[str, Any], buf: Any) -> Any:
    """A torch tensor over `buf` (no copy) from tensor_meta's description."""
    import torch  # only ops that ship tensors pay for the import

    dtype = getattr(torch, meta["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"unknown tensor dtype {meta['dtype']!r}")
    t = torch.frombuffer(bytearray(buf) if len(buf) == 0 else buf, dtype=dtype)
    return t.reshape(meta["shape"])
