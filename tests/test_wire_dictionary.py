"""Dictionary-encoded columns on the wire: they travel as a whole IPC stream body (schema,
dictionary batches, record batch), arrive intact, and a corrupted stream is rejected with a
WireError naming edge and sender while the inbox keeps accepting the real data."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pyarrow as pa
import pytest
import zmq

from dora.runtime import wire
from dora.runtime.channel import Delivery, Inbox, OutEdge, connect_dealer
from dora.runtime.errors import WireError

EDGE = "a/out -> b.in"
SENDER = "a[0]"


def dict_batch(n: int = 1000) -> pa.RecordBatch:
    """A dictionary column with nulls, a nested one (list of dictionary) and plain columns."""
    words = pa.array([None if i % 7 == 0 else f"w{i % 5}" for i in range(n)]).dictionary_encode()
    return pa.RecordBatch.from_pydict({
        "uid": pa.array([f"u{i}" for i in range(n)]),
        "finish_reason": words,
        "tags": pa.array([[f"t{i % 3}"] * (i % 3) for i in range(n)], pa.list_(pa.dictionary(pa.int8(), pa.string()))),
        "policy_version": pa.array(np.arange(n) % 2),
    })


def roundtrip(b: pa.RecordBatch) -> tuple[wire.Header, pa.RecordBatch]:
    frames = wire.encode_batch(b, EDGE, 0, SENDER)
    h = wire.decode_header(frames)
    return h, wire.decode_body(h, [memoryview(f) for f in frames[1:]])


@pytest.mark.parametrize("make", [dict_batch, lambda: dict_batch().slice(101, 500), lambda: dict_batch(50_000),
                                  lambda: dict_batch(3).slice(1, 0)])
def test_dictionary_columns_roundtrip_with_nulls_and_slices(make):
    b = make()
    h, got = roundtrip(b)
    assert h.body == "stream" and h.rows == b.num_rows and h.versions == sorted(set(b.column("policy_version").to_pylist()))
    assert got.schema.equals(b.schema, check_metadata=True)
    assert pa.types.is_dictionary(got.schema.field("finish_reason").type)
    assert got.to_pylist() == b.to_pylist()
    assert got.column("finish_reason").null_count == b.column("finish_reason").null_count


def test_a_slice_sends_only_its_rows():
    b = dict_batch(50_000)
    small = wire.encode_body(b.slice(0, 100))
    assert small.mode == "stream" and small.nbytes < wire.encode_body(b).nbytes / 20


def stream_message() -> list[bytes]:
    return [bytes(memoryview(f)) for f in wire.encode_batch(dict_batch(200), EDGE, 0, SENDER)]


def with_body(frames: list[bytes], body: bytes) -> list[bytes]:
    h = msgpack.unpackb(frames[0])
    h["nbytes"] = len(body)  # the sizes agree: only the body's content is wrong
    return [msgpack.packb(h), body]


def stream_of(*batches: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def index_batch(indices: list[int]) -> pa.RecordBatch:
    d = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(["x", "y"]))
    return pa.RecordBatch.from_arrays([d, pa.array([7] * len(indices))], ["finish_reason", "policy_version"])


def out_of_range_indices() -> bytes:
    """A stream whose dictionary indices point past the dictionary: the record batch message's
    index buffer rewritten from [0, 1, 1, 0] to [0, 1, 100, 0] (a 2-entry dictionary)."""
    raw = bytearray(stream_of(index_batch([0, 1, 1, 0])))
    pattern = np.array([0, 1, 1, 0], np.int32).tobytes()
    at = raw.rfind(pattern)
    assert at > 0 and raw.count(pattern) == 1
    raw[at:at + 16] = np.array([0, 1, 100, 0], np.int32).tobytes()
    return bytes(raw)


def corrupt(kind: str, frames: list[bytes]) -> list[bytes]:
    body = frames[1]
    if kind == "garbage":
        return with_body(frames, b"\xff" * len(body))
    if kind == "truncated":
        return with_body(frames, body[: len(body) // 2])
    schema_len = len(msgpack.unpackb(frames[0])["schema"])  # the stream opens with the schema message
    if kind == "no batch":  # the schema, then zeros: an end-of-stream marker, no record batch
        return with_body(frames, body[:schema_len] + b"\x00" * (len(body) - schema_len))
    if kind == "garbage after schema":
        return with_body(frames, body[:schema_len] + b"\xff" * (len(body) - schema_len))
    if kind == "other schema":  # a valid stream, but not of the schema the header announces
        return with_body(frames, stream_of(pa.RecordBatch.from_pydict({"x": pa.array([1, 2]).dictionary_encode()})))
    if kind == "two batches":
        b = dict_batch(200)
        return with_body(frames, stream_of(b, b))
    if kind == "bad indices":
        return with_body([bytes(memoryview(f)) for f in wire.encode_batch(index_batch([0, 1, 1, 0]), EDGE, 0, SENDER)],
                         out_of_range_indices())
    raise AssertionError(kind)


KINDS = ["garbage", "truncated", "no batch", "garbage after schema", "other schema", "two batches", "bad indices"]


@pytest.mark.parametrize("kind", KINDS)
def test_corrupted_stream_bodies_raise_wire_error_naming_edge_and_sender(kind):
    frames = corrupt(kind, stream_message())
    with pytest.raises(WireError) as ei:
        wire.decode_body(wire.decode_header(frames), frames[1:])
    assert ei.value.edge == EDGE and ei.value.sender == SENDER
    assert "rejected message on edge" in str(ei.value)


def test_inbox_rejects_corrupted_streams_and_then_delivers_the_real_batch():
    zctx = zmq.Context()
    ib = Inbox(zctx)
    ib.expect(EDGE, "in", [SENDER], 8, 1 << 30)
    rogue = connect_dealer(zctx, ib.endpoint)
    out = None
    try:
        for kind in KINDS:  # each a message with sequence number 0 that must not be accepted
            rogue.send_multipart(corrupt(kind, stream_message()))
        got: list[object] = []
        deadline = time.monotonic() + 20
        while len(got) < len(KINDS) and time.monotonic() < deadline:
            d = ib.recv()
            if d is None:
                ib.sock.poll(100)
            else:
                got.append(d)
        assert len(got) == len(KINDS) and all(isinstance(d, WireError) for d in got), got
        assert ib.rejected == len(KINDS) and all(e.edge == EDGE and e.sender == SENDER for e in got)
        # the inbox is still in business: the genuine batch (sequence 0) arrives whole
        out = OutEdge(zctx, EDGE, [ib.endpoint], SENDER, capacity=8, capacity_bytes=1 << 30)
        sent = dict_batch(3000)
        out.put(sent)
        assert out.flush()
        d = None
        while not isinstance(d, Delivery) and time.monotonic() < deadline:
            d = ib.recv()
            if isinstance(d, WireError):
                raise d
            if d is None:
                ib.sock.poll(100)
        assert isinstance(d, Delivery) and d.batch.equals(sent) and ib.rejected == len(KINDS)
    finally:
        rogue.close(0)
        if out is not None:
            out.close()
        ib.close()
        zctx.term()
