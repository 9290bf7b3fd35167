"""Wire format, routing and placement units (no processes)."""

from __future__ import annotations

import msgpack
import numpy as np
import pyarrow as pa
import pytest
import zmq

from dora.graph.model import Graph, Node, Pool
from dora.runtime import routing, wire
from dora.runtime.channel import Delivery, Inbox, OutEdge
from dora.runtime.errors import PlacementError, WireError
from dora.runtime.placement import format_plan, plan
from tests.runtime_graphs import edge

EDGE = "a/out -> b.in"


def batch(n: int = 5, versions: bool = True) -> pa.RecordBatch:
    cols = {"uid": [f"u{i}" for i in range(n)], "group_id": pa.array([i // 2 for i in range(n)], pa.int64())}
    if versions:
        cols["policy_version"] = pa.array([3, 1, 3, 2, 1][:n] + [1] * max(0, n - 5), pa.int64())
    return pa.RecordBatch.from_pydict(cols)


def test_roundtrip_header_and_body():
    b = batch()  # small: one IPC record-batch message
    frames = wire.encode_batch(b, EDGE, 4, "a[0]")
    h = wire.decode_header(frames)
    assert (h.kind, h.edge, h.seq, h.rows, h.sender, h.versions, h.body) == ("batch", EDGE, 4, 5, "a[0]", [1, 2, 3], "ipc")
    assert len(frames) == 2 and h.nbytes == frames[1].size
    # the header's schema message + the body frame are exactly an Arrow IPC stream (less the end marker)
    assert pa.ipc.open_stream(h.schema + frames[1].to_pybytes()).read_all().to_batches()[0].equals(b)
    assert wire.decode_body(h, [memoryview(frames[1])]).equals(b)


def nested_batch(n: int = 3000) -> pa.RecordBatch:
    """Every type the pipelines send, with nulls, nesting and a struct."""
    return pa.RecordBatch.from_pydict({
        "uid": pa.array([f"u{i}" if i % 7 else None for i in range(n)]),
        "group_id": pa.array(np.arange(n) // 4),
        "reward": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
        "tokens": pa.array([list(range(i % 9)) if i % 5 else None for i in range(n)], pa.list_(pa.int32())),
        "logprobs": pa.array([[-0.5] * (i % 4) for i in range(n)], pa.list_(pa.float32())),
        "nested": pa.array([[["a", None], []]] * n, pa.list_(pa.list_(pa.large_string()))),
        "meta": pa.array([{"k": i, "s": "x" * (i % 3)} for i in range(n)]),
        "pair": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int64(), 2)),
        "flag": pa.array([i % 3 == 0 for i in range(n)]),
        "none": pa.array([None] * n),
        "policy_version": pa.array(np.arange(n) % 3),
    })


@pytest.mark.parametrize("make", [nested_batch, lambda: nested_batch().slice(101, 2000), lambda: nested_batch(70),
                                  lambda: pa.RecordBatch.from_pydict({"x": pa.array(np.arange(200_000))})])
def test_buffer_bodies_roundtrip_every_layout_without_copies(make, monkeypatch):
    monkeypatch.setattr(wire, "IPC_BELOW", 0)  # force the buffer body even for small batches
    b = make()
    frames = wire.encode_batch(b, EDGE, 0, "a[0]")
    h = wire.decode_header(frames)
    assert h.body == "buffers" and len(frames) == 1 + sum(1 for s in h.bufs if s >= 0)
    got = wire.decode_body(h, [memoryview(f) for f in frames[1:]])
    assert got.equals(b) and got.schema.equals(b.schema, check_metadata=True)
    if b.column(0).offset == 0:  # unsliced columns go out as the batch's own buffers
        own = {buf.address for col in b.columns for buf in col.buffers() if buf is not None and buf.size}
        assert {f.address for f in frames[1:] if isinstance(f, pa.Buffer) and f.size} <= own
    else:  # a slice is compacted first: only its rows travel
        assert h.nbytes < b.get_total_buffer_size() * 0.8


def test_large_batches_default_to_buffer_bodies_and_small_ones_to_ipc():
    assert wire.encode_body(pa.RecordBatch.from_pydict({"x": pa.array(np.arange(100_000))})).mode == "buffers"
    assert wire.encode_body(batch()).mode == "ipc"
    dict_batch = pa.RecordBatch.from_pydict({"x": pa.array(np.arange(100_000)), "d": pa.array(["a"] * 100_000).dictionary_encode()})
    assert wire.encode_body(dict_batch).mode == "stream"  # dictionaries travel in a whole IPC stream


def other_schema_message() -> bytes:
    return pa.schema([("uid", pa.string()), ("group_id", pa.float64()), ("policy_version", pa.int64())]).serialize().to_pybytes()


def edit(h: bytes, **kw) -> bytes:
    return msgpack.packb({**msgpack.unpackb(h), **kw})


@pytest.mark.parametrize("mutate, message", [
    (lambda h, b: [h], "frame"),
    (lambda h, b: [h, b[:-3]], "truncated"),
    (lambda h, b: [h[:-2], b], "unreadable header"),
    (lambda h, b: [msgpack.packb([1, 2]), b], "not a map"),
    (lambda h, b: [edit(h, rows=9), b], "rows"),
    (lambda h, b: [edit(h, schema_fp=1), b], "fingerprint"),
    (lambda h, b: [edit(h, schema=other_schema_message()), b], "fingerprint"),
    (lambda h, b: [edit(h, schema=b"\xff" * 40), b], "corrupt Arrow body"),
    (lambda h, b: [edit(h, seq="1"), b], "'seq' is str"),
    (lambda h, b: [edit(h, seq=True), b], "'seq' is bool"),
    (lambda h, b: [edit(h, batch_id="x"), b], "batch_id"),
    (lambda h, b: [edit(h, nbytes=1 << 40), b], "exceeds the limit"),
    (lambda h, b: [edit(h, versions=[9]), b], "versions"),
    (lambda h, b: [h, b"\x00" * len(b)], "corrupt Arrow body"),
])
def test_bad_messages_raise_wire_error_naming_edge_and_sender(mutate, message):
    h_raw, body = wire.encode_batch(batch(), EDGE, 0, "a[0]")
    frames = mutate(h_raw, body.to_pybytes())
    with pytest.raises(WireError, match=message) as ei:
        h = wire.decode_header(frames)
        wire.decode_body(h, frames[1:])
    if message not in ("frame", "unreadable header", "not a map"):
        assert ei.value.edge == EDGE and ei.value.sender == "a[0]"


def test_no_pickle_in_wire_module():
    import dora.runtime.wire as w
    src = open(w.__file__).read() + open(__import__("dora.runtime.channel").runtime.channel.__file__).read()
    assert "pickle" not in src.replace("No pickle", "")


def test_stable_hash_is_process_independent_and_splits_rows():
    ints = pa.array([0, 1, 2, 3, 1 << 40, None], pa.int64())
    h = routing.stable_hash(ints)
    assert h.dtype == np.uint64 and h[-1] == routing.stable_hash(pa.array([0]))[0]
    strs = pa.array(["a", "b", "a", None])
    hs = routing.stable_hash(strs)
    assert hs[0] == hs[2] and hs[3] == 0
    import zlib
    assert hs[1] == zlib.crc32(b"b")  # not Python's salted hash()
    b = batch(40, versions=False)
    parts = routing.split_by_hash(b, "group_id", 3)
    assert sum(p.num_rows for _, p in parts) == 40
    owner = {}
    for r, p in parts:
        for g in p.column("group_id").to_pylist():
            assert owner.setdefault(g, r) == r  # one group -> one replica
    with pytest.raises(KeyError, match="nope"):
        routing.split_by_hash(b, "nope", 2)
    with pytest.raises(ValueError, match="unknown routing"):
        routing.parse("random", None)


def test_credits_bound_the_producer_and_least_loaded_routing():
    zctx = zmq.Context()
    inboxes = [Inbox(zctx) for _ in range(2)]
    for ib in inboxes:
        ib.expect(EDGE, "in", ["a[0]"])
    out = OutEdge(zctx, EDGE, [ib.endpoint for ib in inboxes], "a[0]", "least_loaded", capacity=3, capacity_bytes=1 << 30)
    for _ in range(5):
        out.put(batch())
    assert not out.flush()              # 3 sent, 2 waiting for credit
    assert out.inflight_n == [2, 1] and len(out.queue) == 2
    got = []
    for ib in inboxes:
        while True:
            d = ib.recv()
            if isinstance(d, Delivery):
                got.append(d)
                ib.ack(d)
                break
    import time
    deadline = time.monotonic() + 5
    while sum(out.inflight_n) > 1 and time.monotonic() < deadline:
        for i, s in enumerate(out.socks):
            if s.poll(10):
                out.drain_credits(i)
    assert sum(out.inflight_n) == 1 and out.flush()
    assert out.stats["max_inflight_batches"] == 3
    out.close()
    for ib in inboxes:
        ib.close()
    zctx.term()


def test_placement_plan_pools_devices_and_threads():
    g = Graph("p", pools={"gpus": Pool("gpus", "gpu", 2), "cpus": Pool("cpus", "cpu", 8)})
    g.nodes["data"] = Node("data", "x:Y", pool="cpus")
    g.nodes["gen"] = Node("gen", "x:Y", pool="gpus", replicas=3, inputs={"in": edge("data", "gen")})
    g.nodes["rew"] = Node("rew", "x:Y", pool="cpus", replicas=3, inputs={"in": edge("gen", "rew")})
    p = plan(g)
    gens = p.of("gen")
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in gens] == ["0", "1", "0"] and gens[0].device == "cuda:0"
    assert all(r.threads == 2 and r.env["CUDA_VISIBLE_DEVICES"] == "" for r in p.of("rew"))  # 8 slots / 4 replicas
    text = format_plan(p)
    assert "gen[2]" in text and "gpu 0 (CUDA_VISIBLE_DEVICES=0)" in text and "colocated" in text
    assert "data/out -> gen.in: 1 -> 3 replica(s), round_robin" in text
    g.nodes["rew"].pool = "tpus"
    with pytest.raises(PlacementError, match="'rew' names pool 'tpus'"):
        plan(g)


def send_through_live_channel(sent: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Send batches over a real OutEdge -> Inbox pair (tcp) and return what arrived, in order."""
    import time
    zctx = zmq.Context()
    ib = Inbox(zctx)
    ib.expect(EDGE, "in", ["a[0]"], 100, 1 << 40)
    out = OutEdge(zctx, EDGE, [ib.endpoint], "a[0]", capacity=100, capacity_bytes=1 << 40)
    for b in sent:
        out.put(b)
        assert out.flush()
    got = []
    deadline = time.monotonic() + 20
    while len(got) < len(sent) and time.monotonic() < deadline:
        d = ib.recv()
        if isinstance(d, WireError):
            raise d
        if isinstance(d, Delivery):
            got.append(d.batch)
        elif d is None:
            ib.sock.poll(100)
    out.close()
    ib.close()
    zctx.term()
    return got


def test_large_batches_cross_a_live_channel_intact():
    sent = [pa.RecordBatch.from_pydict({"x": pa.array(np.full(200_000, i, dtype=np.int64))}) for i in range(12)]
    sent.append(nested_batch())
    got = send_through_live_channel(sent)  # 1.6 MB each: sent from Arrow's own buffers, zmq holding references
    assert [b.column(0)[0].as_py() for b in got[:12]] == list(range(12))
    assert all(g.equals(s) for g, s in zip(got, sent)) and len(got) == len(sent)


def buffer_message(monkeypatch) -> tuple[dict, list[bytearray]]:
    """A valid buffer-body message as (header dict, [buffer frames]) to mutate."""
    monkeypatch.setattr(wire, "IPC_BELOW", 0)
    frames = wire.encode_batch(nested_batch(200), EDGE, 0, "a[0]")
    return msgpack.unpackb(frames[0]), [bytearray(memoryview(f)) for f in frames[1:]]


def frame_index(h: dict, buf: int) -> int:
    """Index (in the body frames) of the frame holding layout buffer `buf`."""
    assert h["bufs"][buf] >= 0
    return sum(1 for s in h["bufs"][:buf] if s >= 0)


def set_ints(frame: bytearray, dtype, **at) -> None:
    view = np.frombuffer(frame, dtype)
    for i, v in at.items():
        view[int(i[1:])] = v


def shrink(h, body, buf, by):
    body[frame_index(h, buf)] = body[frame_index(h, buf)][:-by]
    h["bufs"][buf] -= by


# layout of nested_batch: uid = node 0, buffers 0 validity, 1 offsets (int32), 2 data;
# group_id = node 1, buffers 3 (absent validity), 4 data; reward = node 2, buffers 5, 6;
# tokens = node 3 (list) buffers 7 validity, 8 offsets, child node 4 buffers 9, 10
@pytest.mark.parametrize("mutate, message", [
    (lambda h, f: f.__setitem__(2, f[2][:-8]), "layout says"),
    (lambda h, f: shrink(h, f, 4, 8), "data buffer too small"),
    (lambda h, f: set_ints(f[frame_index(h, 1)], np.int32, i5=10_000), "offsets"),
    (lambda h, f: set_ints(f[frame_index(h, 1)], np.int32, i200=1 << 30), "offsets"),
    (lambda h, f: set_ints(f[frame_index(h, 1)], np.int32, i0=-4), "offsets"),
    (lambda h, f: set_ints(f[frame_index(h, 8)], np.int32, i200=1 << 20), "offsets"),
    (lambda h, f: h["nodes"].__setitem__(1, h["nodes"][1] - 1), "nulls"),
    (lambda h, f: h["nodes"].__setitem__(3, 5), "without a validity buffer"),
    (lambda h, f: h["nodes"].__setitem__(0, 150), "layout"),
    (lambda h, f: h["nodes"].__setitem__(0, 1 << 40), "layout"),
    (lambda h, f: shrink(h, f, 0, 20), "validity buffer"),
    (lambda h, f: h["nodes"].extend([1, 0]), "more array nodes"),
    (lambda h, f: h["nodes"].__delitem__(slice(-4, None)), "fewer array nodes"),
    (lambda h, f: h["nodes"].append(1), "layout malformed"),
    (lambda h, f: h["bufs"].__setitem__(3, -7), "layout malformed"),
    (lambda h, f: h["bufs"].__setitem__(3, 8), "frame"),
    (lambda h, f: h.__setitem__("body", "ipc"), "unknown body format"),
    (lambda h, f: h.__setitem__("nodes", [True, 0]), "list of ints"),
    (lambda h, f: f.pop(), "frame"),
])
def test_bad_buffer_bodies_raise_wire_error_before_arrow_reads_them(mutate, message, monkeypatch):
    h, body = buffer_message(monkeypatch)
    mutate(h, body)
    h["nbytes"] = sum(len(f) for f in body)  # the sizes agree: only the layout is wrong
    frames = [msgpack.packb(h), *map(bytes, body)]
    with pytest.raises(WireError, match=message) as ei:
        wire.decode_body(wire.decode_header(frames), frames[1:])
    assert ei.value.edge == EDGE and ei.value.sender == "a[0]"


def flat_message(monkeypatch) -> tuple[dict, list[bytearray]]:
    """A buffer-body message of fixed-width columns only (the decoder's flat fast path) to mutate.
    Layout: x (int64, nulls) = node 0, buffers 0 validity, 1 data; y (float32, no nulls) = node 1,
    buffers 2 (absent), 3 data; f (bool, nulls) = node 2, buffers 4, 5."""
    monkeypatch.setattr(wire, "IPC_BELOW", 0)
    n = 300
    b = pa.RecordBatch.from_pydict({"x": pa.array([i if i % 5 else None for i in range(n)], pa.int64()),
                                    "y": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
                                    "f": pa.array([None if i % 7 == 0 else i % 2 == 0 for i in range(n)])})
    frames = wire.encode_batch(b, EDGE, 0, "a[0]")
    h = msgpack.unpackb(frames[0])
    assert h["bufs"][2] == -1 and len(h["nodes"]) == 6
    got = wire.decode_body(wire.decode_header(frames), frames[1:])
    assert got.equals(b)
    return h, [bytearray(memoryview(f)) for f in frames[1:]]


@pytest.mark.parametrize("mutate, message", [
    (lambda h, f: f.__setitem__(1, f[1][:-8]), "layout says"),
    (lambda h, f: shrink(h, f, 1, 8), "data buffer too small"),
    (lambda h, f: shrink(h, f, 3, 4), "data buffer too small"),
    (lambda h, f: shrink(h, f, 0, 30), "validity buffer"),
    (lambda h, f: h["nodes"].__setitem__(1, h["nodes"][1] + 1), "nulls"),
    (lambda h, f: h["nodes"].__setitem__(3, 2), "without a validity buffer"),
    (lambda h, f: h["nodes"].__setitem__(1, 400), "exceeds length"),
    (lambda h, f: h["nodes"].__setitem__(0, 299), "column lengths"),
    (lambda h, f: h["nodes"].__setitem__(0, 1 << 40), "layout"),
    (lambda h, f: h["nodes"].extend([1, 0]), "more array nodes"),
    (lambda h, f: h["nodes"].__delitem__(slice(-2, None)), "fewer array nodes"),
    (lambda h, f: (h["bufs"].append(-1)), "fewer array nodes|more array nodes"),
])
def test_bad_flat_buffer_bodies_raise_wire_error(mutate, message, monkeypatch):
    h, body = flat_message(monkeypatch)
    mutate(h, body)
    h["nbytes"] = sum(len(f) for f in body)
    frames = [msgpack.packb(h), *map(bytes, body)]
    with pytest.raises(WireError, match=message) as ei:
        wire.decode_body(wire.decode_header(frames), frames[1:])
    assert ei.value.edge == EDGE and ei.value.sender == "a[0]"


class _Uuid(pa.ExtensionType):
    """A Python-defined extension type (not hashable: the wire's per-type cache must not need it)."""

    def __init__(self):
        super().__init__(pa.binary(16), "dora.test.uuid")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


@pytest.mark.parametrize("n", [10, 50_000])
def test_extension_columns_travel_as_ipc(n):
    pa.register_extension_type(_Uuid())
    try:
        ext = pa.ExtensionArray.from_storage(_Uuid(), pa.array([i.to_bytes(16, "little") for i in range(n)], pa.binary(16)))
        b = pa.RecordBatch.from_arrays([ext, pa.array(np.arange(n))], ["id", "x"])
        frames = wire.encode_batch(b, EDGE, 0, "a[0]")
        h = wire.decode_header(frames)
        got = wire.decode_body(h, frames[1:])
        assert h.body == "ipc" and got.equals(b) and isinstance(got.schema.field("id").type, _Uuid)
    finally:
        pa.unregister_extension_type("dora.test.uuid")


def test_a_buffer_body_without_frames_is_a_message_of_its_own(monkeypatch):
    """Null columns have no buffers: their buffer body is the header alone, which must not be
    sent with SNDMORE (the next message would be glued onto it)."""
    monkeypatch.setattr(wire, "IPC_BELOW", 0)
    sent = [pa.RecordBatch.from_pydict({"none": pa.array([None] * 7)}), batch()]
    assert wire.encode_body(sent[0]).frames == []
    got = send_through_live_channel(sent)
    assert len(got) == 2 and all(g.equals(s) for g, s in zip(got, sent))
