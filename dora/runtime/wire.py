"""The wire format: what one message on a dora channel looks like, and how it is checked.

Data message = zmq frames:
    frame 0: msgpack header {v, kind, edge, seq, batch_id, rows, schema_fp, versions, sender, nbytes,
             body, nodes, bufs, schema}; schema = the Arrow IPC schema message (cached per schema
             on both sides; the receiver reuses a schema it has seen, byte-compared, instead of
             parsing it; inside the header rather than a frame of its own: one frame less per
             message on each side)
    body "buffers" (batches >= IPC_BELOW bytes): frames 1.. are the batch's own Arrow buffers,
             one frame per present buffer, depth-first over the columns (validity, offsets, data,
             then children), sent copy=False straight from Arrow memory: the sender copies
             nothing. nodes = [length, null_count] per array node depth-first, bufs = each
             buffer's size (-1 = absent). The receiver checks every buffer against the layout
             and the schema, then rebuilds the arrays with pa.Array.from_buffers over the frames.
    body "ipc" (small batches, union/map/view/extension types): frame 1 is the Arrow IPC
             record-batch message (schema + it = a valid IPC stream); nodes and bufs are
             empty. Below IPC_BELOW the copy is cheaper than a frame and an Arrow call per buffer.
    body "stream" (any batch whose schema has a dictionary-encoded field, at any depth): frame 1
             is a complete Arrow IPC stream (schema message, dictionary batches, the one record
             batch, end marker), since a record-batch message alone carries no dictionaries;
             nodes and bufs are empty. The receiver reads it with pa.ipc.open_stream and checks
             that its schema is the announced one, that it holds exactly one batch, and (full
             validation) that every dictionary index lies inside its dictionary.
    nbytes = the size of all body frames.
End-of-stream = 1 frame: a header with kind "eos" (rows 0, nbytes 0, body "", no layout, no schema).
Credit (consumer -> producer, on the same connection) = 1 frame: msgpack {kind: "credit", edge, n, bytes}.
Control message = frame 0 msgpack dict with a "kind" key, then optional raw binary frames
(tensor bytes; their dtype/shape travel in the dict, see `tensor_meta`).

Bodies are sent with copy=False and received as zmq Frames whose buffers go to Arrow
through `pa.py_buffer` without a copy. No pickle anywhere: headers and control messages are
msgpack of plain types only. The body carries no checksum (TCP/IPC already protect bytes in
transit); the checks catch what a buggy or hostile peer can send: unreadable or incomplete
headers, wrong types, truncated or oversized bodies, a schema that is not the one announced,
buffers too small for their lengths, offsets out of order or out of bounds, dictionary indices
out of range, a row count that does not match, replayed or skipped sequence numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A control-call result with raw binary parts lives beside the operator contract (ops return it
# without depending on the runtime); re-exported here for the wire code and its callers.
from dora.ops.base import WithBuffers  # noqa: F401
from dora.runtime.errors import WireError

VERSION = 3  # 3: dictionary-encoded batches travel as a "stream" body
#: largest body a receiver accepts (bytes); a bigger one is rejected before Arrow sees it
MAX_MESSAGE_BYTES = int(os.environ.get("DORA_MAX_MESSAGE_BYTES", 1 << 30))
#: header field -> accepted Python types (bool is excluded from ints explicitly below)
HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "v": (int,), "kind": (str,), "edge": (str,), "seq": (int,), "batch_id": (str,), "rows": (int,),
    "schema_fp": (int,), "versions": (list,), "sender": (str,), "nbytes": (int,),
    "body": (str,), "nodes": (list,), "bufs": (list,), "schema": (bytes,),
}
_MAX_HEADER_BYTES = 1 << 20  # the schema message rides in the header
_MAX_CONTROL_BYTES = 64 << 20
_MAX_FRAMES = 2 + 4096  # header, schema, buffers


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
    body: str          # "buffers" | "ipc" | "" (eos)
    nodes: list[int]   # [length, null_count] per array node, depth-first ("buffers" bodies)
    bufs: list[int]    # size per Arrow buffer, -1 = absent ("buffers" bodies)
    schema: bytes      # the Arrow IPC schema message (b"" for eos)

    def pack(self) -> bytes:
        return _pack_header(self.kind, self.edge, self.seq, self.batch_id, self.rows, self.schema_fp, self.versions,
                            self.sender, self.nbytes, self.body, self.nodes, self.bufs, self.schema)


#: one Packer reused for every header: msgpack.packb builds a new one per call (~0.7 us); pack()
#: runs under the GIL and resets its buffer after each call (also on error), so sharing is safe
_PACKER = msgpack.Packer(use_bin_type=True)


def _pack_header(kind: str, edge: str, seq: int, batch_id: str, rows: int, fp: int, versions: list[int], sender: str,
                 nbytes: int, body: str, nodes: list[int], bufs: list[int], schema: bytes) -> bytes:
    return _PACKER.pack({"v": VERSION, "kind": kind, "edge": edge, "seq": seq, "batch_id": batch_id, "rows": rows,
                         "schema_fp": fp, "versions": versions, "sender": sender, "nbytes": nbytes, "body": body,
                         "nodes": nodes, "bufs": bufs, "schema": schema})


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


class _SchemaInfo:
    """What both sides need per schema, worked out once: its IPC message, its fingerprint, its
    field types and, when every field is a flat fixed-width type (ints, floats, bools, temporals,
    decimals, fixed-size binary), their bit widths: such a batch is one node and two buffers per
    column, which _flat_buffers and _flat_columns handle without the generic recursion."""

    __slots__ = ("schema", "message", "fp", "types", "flat", "has_versions", "has_dictionaries")

    def __init__(self, schema: pa.Schema, message: bytes, fp: int):
        self.schema, self.message, self.fp = schema, message, fp
        self.types = [f.type for f in schema]
        kinds = [_kind(t) for t in self.types]
        self.flat = [(t, k[2]) for t, k in zip(self.types, kinds)] if all(k[0] == "fixed" for k in kinds) else None
        self.has_versions = schema.get_field_index("policy_version") >= 0
        self.has_dictionaries = any(_has_dictionary(t) for t in self.types)


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


_schema_infos: dict[int, _SchemaInfo] = {}   # fingerprint -> its _SchemaInfo


def _schema_info(schema: pa.Schema) -> _SchemaInfo:
    fp = schema_fp(schema)
    info = _schema_infos.get(fp)
    if info is None:
        info = _schema_infos[fp] = _SchemaInfo(schema, schema.serialize().to_pybytes(), fp)
    return info


#: batches whose buffers total less than this go as one Arrow IPC record-batch message: up to
#: ~200 KB that copy costs less than a frame and a from_buffers call per buffer (measured with
#: benchmarks/channel.py's per-message CPU: IPC wins at 128 KB, buffers at 256 KB)
IPC_BELOW = int(os.environ.get("DORA_WIRE_IPC_BELOW", 192 << 10))


@dataclasses.dataclass
class Body:
    """An encoded batch body. mode "buffers": frames = one per present Arrow buffer,
    depth-first, with `nodes` = [length, null_count] per array node (depth-first) and `bufs` =
    the size of each buffer (-1 for an absent one). mode "ipc": frames = [record batch
    message], nodes and bufs empty. mode "stream": frames = [complete IPC stream] (dictionary
    columns), nodes and bufs empty. `schema` is the IPC schema message (it rides in the header)."""

    schema: bytes
    mode: str
    frames: list[Any]
    nodes: list[int]
    bufs: list[int]
    nbytes: int
    fp: int | None = None   # the schema's fingerprint (saves the header a schema lookup)


_kinds: dict[pa.DataType, tuple] = {}


def _kind(t: pa.DataType) -> tuple:
    """How an array of type t is laid out: (name, own buffer count, detail); ("",) if this wire
    does not send it buffer by buffer (dictionary, union, map, views, run-end, extension)."""
    if isinstance(t, pa.BaseExtensionType):
        return ("", 0, 0)  # (and a Python-defined extension type may not even be hashable)
    k = _kinds.get(t)
    if k is None:
        T = pa.types
        if T.is_null(t):
            k = ("null", 1, 0)
        elif T.is_boolean(t):
            k = ("fixed", 2, 1)
        elif T.is_integer(t) or T.is_floating(t) or T.is_temporal(t) or T.is_decimal(t) or T.is_fixed_size_binary(t):
            k = ("fixed", 2, t.bit_width)
        elif T.is_string(t) or T.is_binary(t):
            k = ("binary", 3, np.int32)
        elif T.is_large_string(t) or T.is_large_binary(t):
            k = ("binary", 3, np.int64)
        elif T.is_list(t):
            k = ("list", 2, np.int32)
        elif T.is_large_list(t):
            k = ("list", 2, np.int64)
        elif T.is_fixed_size_list(t):
            k = ("fsl", 1, t.list_size)
        elif T.is_struct(t):
            k = ("struct", 1, 0)
        else:
            k = ("", 0, 0)
        _kinds[t] = k
    return k


def _children(arr: pa.Array, k: tuple) -> list[pa.Array]:
    if k[0] in ("list", "fsl"):
        return [arr.values]
    if k[0] == "struct":
        return [arr.field(i) for i in range(arr.type.num_fields)]
    return []


def _walk(arr: pa.Array, nodes: list[int]) -> bool:
    """Append [length, null_count] of every node depth-first; False if a node is sliced (its
    buffers hold rows it does not use) or of a type sent as IPC."""
    k = _kind(arr.type)
    if not k[0] or arr.offset:
        return False
    nodes += (len(arr), arr.null_count)
    return all(_walk(c, nodes) for c in _children(arr, k))


def _compact(arr: pa.Array) -> pa.Array:
    """A sliced array rewritten with offset 0 and buffers holding only its rows (one copy,
    only for slices): the IPC writer truncates and rebases buffers exactly so."""
    b = pa.RecordBatch.from_arrays([arr], ["c"])
    return pa.ipc.read_record_batch(b.serialize(), b.schema).column(0)


def encode_body(batch: pa.RecordBatch) -> Body:
    """The body of one batch, without copying it: the batch's own Arrow buffers, one zmq frame
    each (sent with copy=False). Small batches and types without a buffer layout here go as one
    IPC message (a copy, cheap at that size or rare), dictionary-encoded ones as a whole IPC
    stream (their dictionaries travel in it); sliced columns are compacted first."""
    info = _schema_info(batch.schema)
    if info.has_dictionaries:
        return _stream_body(batch, info)
    if batch.get_total_buffer_size() >= IPC_BELOW:  # (batch.nbytes costs ~5 us: it resolves slices)
        cols = batch.columns  # (each batch.column(i) call builds a new Python wrapper: fetch them once)
        body = _flat_buffers(cols, info) if info.flat is not None else None
        if body is None:
            body = _buffers(cols, info)
        if body is not None:
            return body
    msg = batch.serialize()
    return Body(info.message, "ipc", [msg], [], [], msg.size, info.fp)


def _take_buffers(col: pa.Array, bufs: list[int], frames: list[Any]) -> int:
    """Append a column's buffers (depth-first) as frames and their sizes (-1 = absent) to bufs;
    returns the bytes added."""
    nbytes = 0
    for b in col.buffers():
        if b is None:
            bufs.append(-1)
        else:
            bufs.append(b.size)
            frames.append(b)
            nbytes += b.size
    return nbytes


def _flat_buffers(cols: list[pa.Array], info: _SchemaInfo) -> Body | None:
    """The buffer body of fixed-width columns: one node, validity and data per column, nothing
    to recurse into (None if a column is sliced: the generic path compacts it)."""
    nodes: list[int] = []
    bufs: list[int] = []
    frames: list[Any] = []
    nbytes = 0
    for col in cols:
        if col.offset:
            return None
        nodes += (len(col), col.null_count)
        nbytes += _take_buffers(col, bufs, frames)
    return Body(info.message, "buffers", frames, nodes, bufs, nbytes, info.fp)


def _buffers(cols: list[pa.Array], info: _SchemaInfo) -> Body | None:
    """The buffer body of any columns with a layout here (None if one has none: send IPC)."""
    nodes: list[int] = []
    bufs: list[int] = []
    frames: list[Any] = []
    nbytes = 0
    for col in cols:
        mark = len(nodes)
        if not _walk(col, nodes):
            del nodes[mark:]
            if not _kind(col.type)[0]:
                return None
            col = _compact(col)
            if not _walk(col, nodes):
                return None
        nbytes += _take_buffers(col, bufs, frames)
    return Body(info.message, "buffers", frames, nodes, bufs, nbytes, info.fp)


def _stream_body(batch: pa.RecordBatch, info: _SchemaInfo) -> Body:
    """A batch with dictionary-encoded columns as one complete IPC stream (schema, dictionary
    batches, the record batch, end marker): batch.serialize() carries no dictionaries."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    buf = sink.getvalue()
    return Body(info.message, "stream", [buf], [], [], buf.size, info.fp)


def encode_header(batch: pa.RecordBatch, body: Body, edge: str, seq: int, sender: str) -> bytes:
    info = _schema_infos.get(body.fp) if body.fp is not None else None
    versions = batch_versions(batch) if info is None or info.has_versions else []
    fp = body.fp if body.fp is not None else schema_fp(batch.schema)
    return _pack_header("batch", edge, seq, f"{sender}:{edge}:{seq}", batch.num_rows, fp, versions, sender,
                        body.nbytes, body.mode, body.nodes, body.bufs, body.schema)


def encode_batch(batch: pa.RecordBatch, edge: str, seq: int, sender: str, body: Body | None = None) -> list[Any]:
    """All frames of one data message: the header (schema message inside), then the body frames."""
    body = encode_body(batch) if body is None else body
    return [encode_header(batch, body, edge, seq, sender), *body.frames]


def encode_eos(edge: str, seq: int, sender: str) -> list[bytes]:
    return [Header("eos", edge, seq, f"{sender}:{edge}:eos", 0, 0, [], sender, 0, "", [], [], b"").pack()]


def _bytes_of(frame: Any) -> memoryview:
    try:
        return frame.buffer  # a zmq.Frame
    except AttributeError:
        return memoryview(frame)


_KEYS = frozenset(HEADER_TYPES)
_ORDER = tuple(HEADER_TYPES)                                   # the order Header.pack writes
_ORDER_TYPES = tuple(types[0] for types in HEADER_TYPES.values())
_INT = {int}


def decode_header(frames: Sequence[Any]) -> Header:
    """Check the frame count and the header; raise WireError naming edge/sender when known."""
    if not 1 <= len(frames) <= _MAX_FRAMES:
        raise WireError(f"expected 1 to {_MAX_FRAMES} frames, got {len(frames)}")
    raw = _bytes_of(frames[0])
    if len(raw) > _MAX_HEADER_BYTES:
        raise WireError(f"header of {len(raw)} bytes exceeds {_MAX_HEADER_BYTES}")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:
        raise WireError(f"unreadable header ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise WireError(f"header is a {type(d).__name__}, not a map")
    # fast path: keys in the order dora writes them, each of its exact type (bool is not int)
    if tuple(d) == _ORDER and tuple(map(type, d.values())) == _ORDER_TYPES:
        edge, sender = d["edge"], d["sender"]
    else:
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
    # the keys are exactly Header's fields and each value has its declared type (checked above):
    # adopt the dict as the instance's attributes instead of a 13-argument __init__ (~0.7 us)
    h = object.__new__(Header)
    h.__dict__ = d
    if h.kind not in ("batch", "eos"):
        raise WireError(f"unknown message kind {h.kind!r}", edge, sender)
    nodes, bufs = h.nodes, h.bufs
    if (h.versions or nodes or bufs) and set(map(type, h.versions + nodes + bufs)) != _INT:  # one pass for all three
        bad = next(k for k in ("versions", "nodes", "bufs") if set(map(type, d[k])) - _INT)
        raise WireError(f"header field {bad!r} must be a list of ints", edge, sender)
    if h.seq < 0 or h.rows < 0 or h.nbytes < 0:
        raise WireError(f"negative seq/rows/nbytes ({h.seq}, {h.rows}, {h.nbytes})", edge, sender)
    if h.batch_id != f"{sender}:{edge}:{h.seq if h.kind == 'batch' else 'eos'}":
        raise WireError(f"batch_id {h.batch_id!r} does not match sender, edge and sequence", edge, sender)
    if h.kind == "eos":
        if h.body or nodes or bufs or h.schema:
            raise WireError("an 'eos' message has no body", edge, sender)
        want_frames = 1
    elif (h.body == "ipc" or h.body == "stream") and not nodes and not bufs:
        want_frames = 2
    elif h.body == "buffers":
        if len(nodes) % 2 or min(nodes, default=0) < 0 or min(bufs, default=-1) < -1:
            raise WireError("header layout malformed (nodes must be [length, null_count] pairs >= 0, "
                            "buffer sizes >= -1)", edge, sender)
        want_frames = 1 + len(bufs) - bufs.count(-1)  # one frame per present buffer
    else:
        raise WireError(f"unknown body format {h.body!r} (or layout given for an ipc body)", edge, sender)
    if len(frames) != want_frames:
        raise WireError(f"this {h.kind!r} message should have {want_frames} frame(s), got {len(frames)}", edge, sender)
    if h.nbytes > MAX_MESSAGE_BYTES:
        raise WireError(f"body of {h.nbytes} bytes exceeds the limit of {MAX_MESSAGE_BYTES} (DORA_MAX_MESSAGE_BYTES)", edge, sender)
    return h


def _schema_of(h: Header, smv: bytes) -> _SchemaInfo:
    known = _schema_infos.get(h.schema_fp)
    if known is not None and known.message == smv:
        return known  # the usual case: a schema seen before, byte for byte
    schema = pa.ipc.read_schema(pa.py_buffer(smv))
    if schema_fp(schema) != h.schema_fp:
        raise WireError("schema fingerprint mismatch: body schema is not the one the header announces", h.edge, h.sender)
    if len(_schema_infos) > 256:  # a peer inventing schemas must not grow this forever
        _schema_infos.clear()
    info = _schema_infos[h.schema_fp] = _SchemaInfo(schema, smv, h.schema_fp)
    return info


class _Bad(Exception):
    """A body inconsistent with its declared layout (becomes a WireError naming edge/sender)."""


def _frame_buffer(mv: memoryview, size: int, index: int) -> pa.Buffer:
    """Layout buffer `index` over its frame, which must be exactly `size` bytes."""
    if len(mv) != size:
        raise _Bad(f"buffer {index} is {len(mv)} bytes, layout says {size} (truncated or padded)")
    buf = pa.py_buffer(mv)
    if buf.address % 8:  # zmq may hand small frames at odd addresses; Arrow wants aligned data
        buf = pa.py_buffer(np.frombuffer(mv, np.uint8).copy())
    return buf


def _flat_columns(h: Header, info: _SchemaInfo, frames: list[memoryview]) -> list[pa.Array] | None:
    """The columns of a fixed-width-only schema (info.flat), with _Rebuild.fixed's checks in one
    loop: the hot path of large numeric batches, ~2x cheaper than the generic walk. None if the
    layout is not one node and two buffers per column: the generic walk then says what is wrong."""
    nodes, bufs = h.nodes, h.bufs
    if len(nodes) != 2 * len(info.flat) or len(bufs) != len(nodes):
        return None
    cols = []
    fi = 0  # next frame (absent buffers have none)
    for i, (t, bit_width) in enumerate(info.flat):
        n, nulls = nodes[2 * i], nodes[2 * i + 1]
        if nulls > n:
            raise _Bad(f"null count {nulls} exceeds length {n}")
        pair: list[pa.Buffer | None] = [None, None]  # validity, data
        for j in (0, 1):
            size = bufs[2 * i + j]
            if size >= 0:
                pair[j] = _frame_buffer(frames[fi], size, 2 * i + j)
                fi += 1
        valid, data = pair
        _Rebuild.check_validity(valid, n, nulls)
        if (n * bit_width + 7) // 8 > (data.size if data is not None else 0):
            raise _Bad(f"{t} data buffer too small for {n} values")
        cols.append(_Rebuild.built(pa.Array.from_buffers(t, n, pair, -1 if valid is not None else nulls, 0), valid, nulls))
    return cols


class _Rebuild:
    """Rebuilds arrays over the received frames (no copy), checking every buffer against the
    layout before Arrow sees it: sizes cover length x width, offsets start >= 0, never decrease
    and stay inside the data or child, null counts match the validity bitmaps. That is what
    Arrow's full validation guarantees against out-of-bounds reads, without its UTF-8 scan
    (which costs ~2 ms per 16 MB of strings; invalid UTF-8 cannot read out of bounds)."""

    def __init__(self, h: Header, frames: list[memoryview]):
        self.nodes, self.bufs, self.frames = h.nodes, h.bufs, frames
        self.ni = self.bi = self.fi = 0

    def buffer(self) -> pa.Buffer | None:
        if self.bi >= len(self.bufs):
            raise _Bad("layout declares fewer buffers than the schema needs")
        size = self.bufs[self.bi]
        self.bi += 1
        if size < 0:
            return None
        mv = self.frames[self.fi]
        self.fi += 1
        return _frame_buffer(mv, size, self.bi - 1)

    def node(self) -> tuple[int, int]:
        if self.ni + 2 > len(self.nodes):
            raise _Bad("layout declares fewer array nodes than the schema needs")
        n, nulls = self.nodes[self.ni], self.nodes[self.ni + 1]
        self.ni += 2
        if nulls > n:
            raise _Bad(f"null count {nulls} exceeds length {n}")
        return n, nulls

    @staticmethod
    def check_validity(valid: pa.Buffer | None, n: int, nulls: int) -> None:
        if valid is None:
            if nulls:
                raise _Bad(f"{nulls} nulls declared without a validity buffer")
        elif valid.size < (n + 7) // 8:
            raise _Bad(f"validity buffer of {valid.size} bytes for {n} values")

    def fixed(self, t: pa.DataType, bit_width: int) -> pa.Array:
        """A fixed-width array (validity + data); _flat_columns does the same checks in one loop."""
        n, nulls = self.node()
        valid, data = self.buffer(), self.buffer()
        self.check_validity(valid, n, nulls)
        if (n * bit_width + 7) // 8 > (data.size if data is not None else 0):
            raise _Bad(f"{t} data buffer too small for {n} values")
        return self.built(pa.Array.from_buffers(t, n, [valid, data], -1 if valid is not None else nulls, 0), valid, nulls)

    @staticmethod
    def built(arr: pa.Array, valid: pa.Buffer | None, nulls: int) -> pa.Array:
        if valid is not None and arr.null_count != nulls:
            raise _Bad(f"validity bitmap has {arr.null_count} nulls, layout says {nulls}")
        return arr

    def array(self, t: pa.DataType, depth: int = 0) -> pa.Array:
        name, nown, detail = _kind(t)
        if not name or depth > 64:
            raise _Bad(f"type {t} cannot be sent buffer by buffer")
        if name == "fixed":
            return self.fixed(t, detail)
        n, nulls = self.node()
        own = [self.buffer() for _ in range(nown)]
        valid = own[0]
        if name == "null":
            if valid is not None or nulls != n:
                raise _Bad("a null array has no validity buffer and only nulls")
        else:
            self.check_validity(valid, n, nulls)
        children: list[pa.Array] = []
        if name in ("binary", "list"):
            child_len = own[2].size if name == "binary" and own[2] is not None else 0
            if name == "list":
                children = [self.array(t.value_type, depth + 1)]
                child_len = len(children[0])
            self.offsets(own[1], n, detail, child_len)
        elif name == "fsl":
            children = [self.array(t.value_type, depth + 1)]
            if len(children[0]) < n * detail:
                raise _Bad(f"fixed-size list child has {len(children[0])} values, needs {n * detail}")
        elif name == "struct":
            children = [self.array(t.field(i).type, depth + 1) for i in range(t.num_fields)]
            if any(len(c) < n for c in children):
                raise _Bad(f"struct child shorter than its {n} rows")
        return self.built(pa.Array.from_buffers(t, n, own, -1 if valid is not None else nulls, 0, children or None),
                          valid, nulls)

    @staticmethod
    def offsets(buf: pa.Buffer | None, n: int, dtype: Any, limit: int) -> None:
        w = np.dtype(dtype).itemsize
        size = buf.size if buf is not None else 0
        if n == 0 and (size == 0 or size >= w):
            return  # an empty array's offsets may be absent
        if size < (n + 1) * w:
            raise _Bad(f"offsets buffer of {size} bytes for {n} values")
        o = np.frombuffer(buf, dtype, n + 1)
        if o[0] < 0 or o[n] > limit or bool((o[1:] < o[:-1]).any()):
            raise _Bad(f"offsets out of order or outside the {limit} values/bytes they index")


def _read_stream(buf: pa.Buffer, info: _SchemaInfo) -> pa.RecordBatch:
    """The one record batch of a "stream" body (dictionary-encoded columns), zero-copy over the
    frame. The stream's own schema must be the announced one, and it must hold exactly one batch."""
    reader = pa.ipc.open_stream(buf)
    if not reader.schema.equals(info.schema, check_metadata=True):
        raise _Bad("the stream's schema is not the one the header announces (fingerprint mismatch)")
    try:
        batch = reader.read_next_batch()
    except StopIteration:
        raise _Bad("a stream body holds no record batch") from None
    try:
        reader.read_next_batch()
    except StopIteration:
        pass
    else:
        raise _Bad("a stream body holds more than one record batch")
    # dictionary indices must lie inside their dictionary, which only full validation checks
    # (an O(rows) scan, UTF-8 included: acceptable for these rare batches, not for every batch)
    batch.validate(full=True)
    return batch


def decode_body(h: Header, frames: Sequence[Any]) -> pa.RecordBatch:
    """The record batch of a data message, zero-copy over the zmq frames; checks size, schema
    and (buffer bodies) every buffer against the declared layout."""
    mvs = [_bytes_of(f) for f in frames]
    size = sum(map(len, mvs))
    if size != h.nbytes:
        raise WireError(f"body is {size} bytes, header says {h.nbytes} (truncated or padded)", h.edge, h.sender)
    try:
        info = _schema_of(h, h.schema)
        if h.body == "ipc":
            batch = pa.ipc.read_record_batch(pa.py_buffer(mvs[0]), info.schema)
        elif h.body == "stream":
            batch = _read_stream(pa.py_buffer(mvs[0]), info)
        else:
            cols = _flat_columns(h, info, mvs) if info.flat is not None else None
            if cols is None:
                rb = _Rebuild(h, mvs)
                cols = [rb.array(t) for t in info.types]
                if rb.ni != len(h.nodes) or rb.bi != len(h.bufs):
                    raise _Bad("layout declares more array nodes or buffers than the schema has")
            if any(len(c) != h.rows for c in cols):
                raise _Bad(f"column lengths {[len(c) for c in cols][:8]} differ from the {h.rows} rows announced")
            batch = pa.RecordBatch.from_arrays(cols, schema=info.schema)
        batch.validate()  # buffer sizes vs lengths: Arrow must not read past the body
    except WireError:
        raise
    except _Bad as e:
        raise WireError(f"body inconsistent with its layout: {e}", h.edge, h.sender) from None
    except Exception as e:
        raise WireError(f"corrupt Arrow body ({type(e).__name__}: {str(e)[:200]})", h.edge, h.sender) from None
    if batch.num_rows != h.rows:
        raise WireError(f"body has {batch.num_rows} rows, header says {h.rows}", h.edge, h.sender)
    if (batch_versions(batch) if info.has_versions else []) != h.versions:
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
