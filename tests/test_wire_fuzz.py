"""10,000 random or mutated frames sent at a live worker's inbox are all rejected; the worker
survives and the real data that follows is delivered whole."""

from __future__ import annotations

import random

import msgpack
import pyarrow as pa
import zmq

from dora.graph.model import Graph, Node
from dora.runtime import wire
from dora.runtime.run_controller import Controller
from tests.runtime_graphs import OPS, edge, read_sink

N_FRAMES = 10_000
EDGE = "src/out -> sink.in"


def valid_message(seq: int = 0, sender: str = "controller", buffers: bool = False) -> list[bytes]:
    """A valid message: an IPC body, or (buffers=True) the batch's Arrow buffers one per frame."""
    b = pa.RecordBatch.from_pydict({"uid": ["a", "b"], "group_id": pa.array([1, 2], pa.int64())})
    below, wire.IPC_BELOW = wire.IPC_BELOW, 0 if buffers else wire.IPC_BELOW
    try:
        return [bytes(memoryview(f)) for f in wire.encode_batch(b, EDGE, seq, sender)]
    finally:
        wire.IPC_BELOW = below


def mutate_header(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    h = msgpack.unpackb(frames[0])
    k = rng.choice(list(h))
    choice = rng.randrange(6)
    if choice == 0:
        del h[k]
    elif choice == 1:
        h["extra"] = 1
    elif choice == 2:
        h[k] = rng.choice([None, "x", -1, 3.5, [1], {"a": 1}, b"zz", True])
    elif choice == 3:
        h["nbytes"] = h["nbytes"] + rng.choice([-1, 1, 1 << 40])
    elif choice == 4:
        h[rng.choice(["rows", "schema_fp"])] += rng.randrange(1, 1000)
    elif choice == 5 and h["body"] == "buffers":  # lie about a column length, a null count or a buffer size
        key, i = rng.choice([("nodes", 0), ("nodes", 1), ("bufs", rng.randrange(len(h["bufs"])))])
        h[key][i] += rng.choice([-1, 1, 7, 1 << 20])
    else:
        h["kind"] = rng.choice(["credit", "EOS", ""])
    return [msgpack.packb(h), *frames[1:]]


def fuzz_frames(rng: random.Random) -> list[bytes]:
    """One hostile message: garbage, wrong sender/sequence, or a valid message mutated."""
    kind = rng.randrange(8)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:
        return valid_message(sender="mallory")
    if kind == 2:
        return valid_message(seq=rng.randrange(1, 1 << 30))          # replayed / skipped sequence
    f = valid_message(buffers=rng.random() < 0.5)
    if kind == 3:
        return mutate_header(rng, f)
    if kind == 4:
        i = rng.randrange(1, len(f))                                   # truncated IPC message or buffer
        f[i] = f[i][: rng.randrange(0, len(f[i]))] if f[i] else b"x"
        return f
    if kind == 5:
        f[1] = rng.randbytes(len(f[1]))                                # garbage of the announced size
        return f                                                       # (IPC message or uid's offsets)
    if kind == 6:                                                      # another schema, or garbage
        h = msgpack.unpackb(f[0])
        other = pa.schema([("uid", pa.string()), ("group_id", pa.float64())]).serialize().to_pybytes()
        h["schema"] = rng.choice([other, rng.randbytes(len(h["schema"])), h["schema"][:-8]])
        return [msgpack.packb(h), *f[1:]]
    h = bytearray(f[0])
    for _ in range(rng.randrange(1, 4)):
        h[rng.randrange(len(h))] ^= 1 << rng.randrange(8)
    # a flipped bit in a string value can still be valid msgpack; make sure the message is wrong anyway
    return [bytes(h), *f[1:], b""] if rng.random() < 0.5 else [bytes(h)]


class FuzzDriver:
    """Holds the source's batches, fuzzes the sink's inbox, waits until every frame was rejected,
    then forwards the real batches and closes the edge."""

    def __init__(self):
        self.ctl: Controller | None = None
        self.held: list[pa.RecordBatch] = []
        self.phase = "fuzz"
        self.source_done = False
        self.rejected_seen = 0

    def managed_edges(self):
        return [("src", "sink")]

    def on_batch(self, src, batch):
        self.held.append(batch)

    def on_eos(self, src, dst):
        self.source_done = True

    def tick(self, now):
        if self.phase == "fuzz":
            zctx = zmq.Context.instance()
            s = zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(self.ctl.endpoint("sink", 0))
            rng = random.Random(1234)
            for _ in range(N_FRAMES):
                s.send_multipart(fuzz_frames(rng))
            s.close()
            self.phase = "wait"
        elif self.phase == "wait":
            self.rejected_seen = self.ctl.call("sink", 0, "worker_stats", timeout=30)["stats"]["rejected"]
            if self.rejected_seen >= N_FRAMES and self.source_done:
                for b in self.held:
                    self.ctl.send("sink", 0, "in", b)
                self.ctl.close("sink", "in")
                self.phase = "fed"

    def done(self):
        return False


def test_fuzzed_inbox_rejects_everything_and_worker_survives(tmp_path):
    g = Graph("fuzz")
    g.nodes["src"] = Node("src", OPS + "Source", {"rows": 500, "batch_rows": 50})
    g.nodes["sink"] = Node("sink", OPS + "Sink", {}, inputs={"in": edge("src", "sink")})
    d = FuzzDriver()
    d.ctl = Controller(g, driver=d, run_dir=str(tmp_path), deadline_s=90)
    res = d.ctl.run()
    assert res.ok and d.phase == "fed"
    assert d.rejected_seen == N_FRAMES and res.rejected == N_FRAMES
    samples = res.stats["sink[0]"]["reject_samples"]
    assert samples and all("rejected message on edge" in s for s in samples)
    t = read_sink(str(tmp_path))
    assert sorted(t.column("uid").to_pylist()) == sorted(f"u{i}" for i in range(500))
