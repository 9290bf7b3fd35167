"""User ops for the runtime tests (imported by workers as `tests.runtime_ops:Class`).

Source -> Map -> GroupReducer -> Sink exercises routing, group_by, fan-in and end-of-stream;
params turn on failure modes (raise, SIGKILL self, SIGSTOP self) and slowness.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict

import pyarrow as pa

from dora.graph.opspec import OpSpec, ParamSpec, PortSpec
from dora.ops.base import Operator

P = ParamSpec


def _params(*specs: ParamSpec) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


class Source(Operator):
    """rows rows in batches of batch_rows; row i: uid "u<i>", group_id i % (rows // group_size),
    so the rows of one group are spread over many batches (and so over map replicas)."""

    spec = OpSpec(
        name="tests.runtime_ops:Source", doc="numbered rows", inputs=(), adds=("uid", "group_id"),
        params=_params(P("rows", "int", 1000, "rows in total"), P("batch_rows", "int", 100, "rows per batch"),
                       P("group_size", "int", 4, "rows per group"), P("payload_bytes", "int", 0, "bytes of padding per row"),
                       P("delay_s", "float", 0.0, "sleep before each batch")),
        impl="tests.runtime_ops:Source",
    )

    def source(self):
        p = self.ctx.params
        groups = max(1, p["rows"] // p["group_size"])
        pad = b"x" * p["payload_bytes"]
        for start in range(0, p["rows"], p["batch_rows"]):
            if p["delay_s"]:
                time.sleep(p["delay_s"])
            ids = range(start, min(p["rows"], start + p["batch_rows"]))
            cols = {"uid": pa.array([f"u{i}" for i in ids]), "group_id": pa.array([i % groups for i in ids], pa.int64())}
            if pad:
                cols["payload"] = pa.array([pad] * len(ids), pa.binary())
            yield pa.RecordBatch.from_pydict(cols)


class Map(Operator):
    """Adds `mapped_by`; fail_mode (raise | sigkill | sigstop) fires at batch fail_at of replica 0."""

    spec = OpSpec(
        name="tests.runtime_ops:Map", doc="tags rows with the replica that mapped them",
        inputs=(PortSpec("in", ("uid",)),), adds=("mapped_by",),
        params=_params(P("fail_mode", "str", "none", "none | raise | sigkill | sigstop | hang"), P("fail_at", "int", 2, "batch index"),
                       P("delay_s", "float", 0.0, "sleep per batch"),
                       P("fail_once", "bool", False, "fail only the first time (a respawn then runs clean)")),
        impl="tests.runtime_ops:Map",
    )

    def setup(self, ctx):
        super().setup(ctx)
        self.seen = 0

    def process(self, batch, port):
        p = self.ctx.params
        once = os.path.join(self.ctx.run_dir or ".", f"{self.ctx.label}.failed")
        if self.ctx.replica == 0 and self.seen == p["fail_at"] and not (p["fail_once"] and os.path.exists(once)):
            if p["fail_once"]:
                open(once, "w").close()   # a respawned replica must not fail again
            mode = p["fail_mode"]
            if mode == "raise":
                raise RuntimeError(f"test failure in {self.ctx.label} at batch {self.seen}")
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "hang":   # the process lives and its heartbeat thread beats; the op never returns
                threading.Event().wait()
        self.seen += 1
        if p["delay_s"]:
            time.sleep(p["delay_s"])
        return [batch.append_column("mapped_by", pa.array([self.ctx.label] * batch.num_rows))]


class GroupReducer(Operator):
    """Buffers rows by group_id and emits each group whole (in one batch) once it has group_size rows.
    Fails at finish if a group is incomplete or over-full: the exactly-once check of group_by."""

    spec = OpSpec(
        name="tests.runtime_ops:GroupReducer", doc="whole groups out",
        inputs=(PortSpec("in", ("group_id",)),), adds=("reduced_by",),
        params=_params(P("group_size", "int", 4, "rows per group")),
        impl="tests.runtime_ops:GroupReducer",
    )

    def setup(self, ctx):
        super().setup(ctx)
        self.buf: dict[int, list[pa.RecordBatch]] = defaultdict(list)
        self.count: dict[int, int] = defaultdict(int)

    def process(self, batch, port):
        g = self.ctx.params["group_size"]
        done = []
        gids = batch.column("group_id").to_pylist()
        for gid in sorted(set(gids)):
            rows = batch.filter(pa.compute.equal(batch.column("group_id"), gid))
            self.buf[gid].append(rows)
            self.count[gid] += rows.num_rows
            if self.count[gid] > g:
                raise RuntimeError(f"group {gid} has {self.count[gid]} rows > group_size {g} (a row arrived twice)")
            if self.count[gid] == g:
                done.extend(self.buf.pop(gid))
                del self.count[gid]
        if not done:
            return []
        out = pa.Table.from_batches(done).combine_chunks().to_batches()[0]
        return [out.append_column("reduced_by", pa.array([self.ctx.label] * out.num_rows))]

    def finish(self):
        if self.buf:
            raise RuntimeError(f"{len(self.buf)} incomplete groups at end of stream, e.g. {sorted(self.buf)[:5]}")
        return []


class Sink(Operator):
    """Writes every batch to run_dir/<node>-<replica>.arrow; delay_s makes it a slow consumer."""

    spec = OpSpec(
        name="tests.runtime_ops:Sink", doc="collect rows to a file", inputs=(PortSpec("in", ()),), adds=(),
        params=_params(P("delay_s", "float", 0.0, "sleep per batch")),
        impl="tests.runtime_ops:Sink",
    )

    def setup(self, ctx):
        super().setup(ctx)
        self.batches: list[pa.RecordBatch] = []

    def process(self, batch, port):
        if self.ctx.params["delay_s"]:
            time.sleep(self.ctx.params["delay_s"])
        # keep only small columns: the back-pressure test's payload would otherwise pile up here
        self.batches.append(batch.drop_columns([c for c in ("payload",) if c in batch.schema.names]))
        return []

    def finish(self):
        path = os.path.join(self.ctx.run_dir, f"{self.ctx.node}-{self.ctx.replica}.arrow")
        if self.batches:
            with pa.ipc.new_file(path, self.batches[0].schema) as w:
                for b in self.batches:
                    w.write_batch(b)
        self.ctx.report({"kind": "sink_rows", "rows": sum(b.num_rows for b in self.batches)})
        return []


class Echo(Operator):
    """Passes batches through and answers control calls (for driver and call tests)."""

    spec = OpSpec(name="tests.runtime_ops:Echo", doc="pass-through with control methods", inputs=(PortSpec("in", ()),),
                  adds=(), params={}, impl="tests.runtime_ops:Echo")
    control_methods = ("load_version", "boom")

    def setup(self, ctx):
        super().setup(ctx)
        self.version = 0

    def load_version(self, version: int) -> dict:
        self.version = version
        self.ctx.report({"kind": "loaded", "version": version})
        return {"version": version, "replica": self.ctx.replica}

    def boom(self) -> None:
        raise ValueError("boom on request")

    def process(self, batch, port):
        return [batch]


def any_devices(params: dict, devices: int) -> None:
    """DeviceProbe may hold any number of devices (it stands in for a tensor-parallel engine)."""
    return None


class Trajectories(Operator):
    """Trainer input without a generator: `groups` groups of `group_size` rows with uneven lengths,
    zero behaviour logprobs and +-1 advantages (enough for the update op to take real steps)."""

    spec = OpSpec(
        name="tests.runtime_ops:Trajectories", doc="synthetic scored trajectories", inputs=(),
        adds=("uid", "group_id", "prompt_ids", "response_ids", "behavior_logprobs", "advantages", "policy_version"),
        params=_params(P("groups", "int", 8, "groups"), P("group_size", "int", 2, "rows per group")),
        impl="tests.runtime_ops:Trajectories",
    )

    def source(self):
        p = self.ctx.params
        for g in range(p["groups"]):
            rows = [{"uid": f"{g}-{i}", "group_id": g, "prompt_ids": [5 + g % 7, 6, 7], "response_ids": [20 + i] * (1 + (g + i) % 5),
                     "advantages": [1.0 if i % 2 else -1.0] * (1 + (g + i) % 5), "policy_version": 0}
                    for i in range(p["group_size"])]
            for r in rows:
                r["behavior_logprobs"] = [0.0] * len(r["response_ids"])
            yield pa.RecordBatch.from_pylist(rows)


class DeviceProbe(Operator):
    """Pass-through whose replicas may hold several devices (devices: N); reports where it runs."""

    spec = OpSpec(name="tests.runtime_ops:DeviceProbe", doc="pass-through that reports its placement",
                  inputs=(PortSpec("in", ()),), adds=(), params={}, impl="tests.runtime_ops:DeviceProbe",
                  devices_check="tests.runtime_ops:any_devices")

    def setup(self, ctx):
        super().setup(ctx)
        ctx.report({"kind": "probe", "devices": ctx.devices, "pid": os.getpid()})

    def process(self, batch, port):
        return [batch]
