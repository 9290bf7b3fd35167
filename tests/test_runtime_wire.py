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
    b = batch()
    frames = wire.encode_batch(b, EDGE, 4, "a[0]")
    h = wire.decode_header(frames)
    assert (h.kind, h.edge, h.seq, h.rows, h.sender, h.versions) == ("batch", EDGE, 4, 5, "a[0]", [1, 2, 3])
    assert h.nbytes == len(frames[1]) + frames[2].size
    # the two body frames are exactly an Arrow IPC stream (less the optional end marker)
    assert pa.ipc.open_stream(bytes(frames[1]) + frames[2].to_pybytes()).read_all().to_batches()[0].equals(b)
    assert wire.decode_body(h, [memoryview(frames[1]), memoryview(frames[2])]).equals(b)


def other_schema_message() -> bytes:
    return pa.schema([("uid", pa.string()), ("group_id", pa.float64()), ("policy_version", pa.int64())]).serialize().to_pybytes()


def edit(h: bytes, **kw) -> bytes:
    return msgpack.packb({**msgpack.unpackb(h), **kw})


@pytest.mark.parametrize("mutate, message", [
    (lambda h, s, b: [h], "frame"),
    (lambda h, s, b: [h, s, b[:-3]], "truncated"),
    (lambda h, s, b: [h[:-2], s, b], "unreadable header"),
    (lambda h, s, b: [msgpack.packb([1, 2]), s, b], "not a map"),
    (lambda h, s, b: [edit(h, rows=9), s, b], "rows"),
    (lambda h, s, b: [edit(h, schema_fp=1), s, b], "fingerprint"),
    (lambda h, s, b: [edit(h, nbytes=len(other_schema_message()) + len(b)), other_schema_message(), b], "fingerprint"),
    (lambda h, s, b: [edit(h, seq="1"), s, b], "'seq' is str"),
    (lambda h, s, b: [edit(h, seq=True), s, b], "'seq' is bool"),
    (lambda h, s, b: [edit(h, batch_id="x"), s, b], "batch_id"),
    (lambda h, s, b: [edit(h, nbytes=1 << 40), s, b], "exceeds the limit"),
    (lambda h, s, b: [edit(h, versions=[9]), s, b], "versions"),
    (lambda h, s, b: [h, s, b"\x00" * len(b)], "corrupt Arrow body"),
])
def test_bad_messages_raise_wire_error_naming_edge_and_sender(mutate, message):
    h_raw, s_raw, body = wire.encode_batch(batch(), EDGE, 0, "a[0]")
    frames = mutate(h_raw, s_raw, body.to_pybytes())
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


def test_pooled_send_buffers_are_not_reused_while_zmq_holds_them():
    zctx = zmq.Context()
    ib = Inbox(zctx)
    ib.expect(EDGE, "in", ["a[0]"], 100, 1 << 40)
    out = OutEdge(zctx, EDGE, [ib.endpoint], "a[0]", capacity=100, capacity_bytes=1 << 40)
    sent = [pa.RecordBatch.from_pydict({"x": pa.array(np.full(200_000, i, dtype=np.int64))}) for i in range(12)]
    for b in sent:  # 1.6 MB each: serialized into pooled buffers
        out.put(b)
        assert out.flush()
    assert out.pool.busy, "large batches should go through the send buffer pool"
    got = []
    import time
    deadline = time.monotonic() + 20
    while len(got) < len(sent) and time.monotonic() < deadline:
        d = ib.recv()
        if isinstance(d, Delivery):
            got.append(d.batch)
        elif d is None:
            ib.sock.poll(100)
    assert [b.column("x")[0].as_py() for b in got] == list(range(12))
    assert all(g.equals(s) for g, s in zip(got, sent))
    out.close()
    ib.close()
    zctx.term()
