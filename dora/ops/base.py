"""The operator contract: the one interface every op (built-in or user) implements.

A worker (one per node replica, in a process or a Ray actor) owns one Operator and drives it:

    op.setup(ctx)                       once, before any data
    op.source() -> Iterator[batch]      sources only (ops with no data inputs): pulled on demand,
                                        one batch per credit, so a source never outruns its consumers
    op.process(batch, port) -> batches  one input batch in, zero or more output batches out
    op.poll() -> batches                called while op.busy() is true and no input is waiting:
                                        engines step here and return what finished
    op.accepts_input() -> bool          False while the op holds all the work it may (a judge's
                                        max_in_flight): the worker reads no input meanwhile, so the
                                        input edges' credits run out and producers wait (back-pressure)
    op.finish() -> batches              after end-of-stream on every input (flush buffers)
    op.call(method, args) -> result     a control request from the controller, only for names in
                                        `control_methods` (load_version, export, import, stats, ...)
    op.live_stats() -> dict | None      cheap counters for the run dashboard (version hosted,
                                        running requests, KV use, tokens generated), read by the
                                        worker's own thread about twice a second
    op.teardown()

Returned batches go to the node's output port "out". Everything on the wire is an Arrow
RecordBatch whose columns use the names in dora.graph.columns.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa

from dora.graph.policy_roles import policy_dir
from dora.graph.sections import AsyncSettings


@dataclasses.dataclass
class OpContext:
    """What an operator knows about where it runs. Built by the worker from the graph and plan."""

    node: str                      # node name in the graph
    op: str                        # op name (registry key or import path)
    replica: int                   # this replica's index, 0..replicas-1 (beyond: an elastic spare)
    replicas: int                  # number of replicas of this node
    params: dict[str, Any]         # every declared param, checked, typed, defaults filled (index, never .get)
    model: dict[str, Any]          # the pipeline's shared `model:` section
    device: str = "cpu"            # torch device string for this replica ("cpu", "cuda:0")
    threads: int = 1               # CPU threads this replica may use
    seed: int = 0
    run_dir: str | None = None     # where checkpoints / weight files / logs go
    async_: AsyncSettings = dataclasses.field(default_factory=AsyncSettings)  # after the mode's rules
    # A resumed run: this replica's part of the checkpoint it starts from (None: a fresh start).
    restore: dict[str, Any] | None = None
    devices: int = 1               # devices this replica holds (generate on vllm: its tensor-parallel size)
    # The node's declared share of each of its devices' memory (0 < memory <= 1), when it shares them
    # with other nodes (dora/graph/device_shares.py); None: the whole device. On CUDA the worker caps
    # torch's allocator at it before setup; the torch engine sizes its KV pool from it.
    memory: float | None = None
    # A sharded op with replicas > 1 (update, critic, reference): replica = rank, replicas = ranks of
    # one process group. Rank 0 gets {"host", "port": 0}, binds a port there and reports
    # {"kind": "rendezvous", "host", "port"}; the other ranks get that address. None: one rank.
    rendezvous: dict[str, Any] | None = None
    # Set by the worker: send an event to the controller (metrics, weights published, ...).
    report: Callable[[dict[str, Any]], None] = lambda event: None
    # Set by the worker: "still working". Call it inside long loops (a micro-batch, an engine step):
    # the stall watchdog fails a replica that stays inside one op call without it for --stall-timeout.
    progress: Callable[[], None] = lambda: None

    @property
    def label(self) -> str:
        return f"{self.node}[{self.replica}]"

    @property
    def files_dir(self) -> str | None:
        """Where this node's policy keeps its own files (the trainer's trained.jsonl, weight versions,
        checkpoints; a broadcast's rendezvous): run_dir, or run_dir/policies/<update node> in a run of
        several policies (dora/graph/policies.py)."""
        if self.run_dir is None or self.async_.policy is None:
            return self.run_dir
        return policy_dir(self.run_dir, self.async_.policy)

    @property
    def elastic_spare(self) -> bool:
        """async.elastic: a replica past the node's count, placed on the trainer's devices and lent
        to rollout only while the trainer waits (dora/runtime/placement.py)."""
        return self.replica >= self.replicas


@dataclasses.dataclass
class WithBuffers:
    """A control-method result with raw binary parts (e.g. KV tensors): `value` must be
    msgpack-able and describe the buffers; the buffers travel as their own frames, never pickled."""

    value: Any
    buffers: list[Any]


class Operator:
    """Base class: override what your op needs. Defaults make a pass-through-free no-op."""

    #: names of methods the controller may invoke through op.call (control plane)
    control_methods: tuple[str, ...] = ()

    def setup(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def source(self) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError(f"{type(self).__name__} has no data inputs but does not implement source()")

    def process(self, batch: pa.RecordBatch, port: str) -> Iterable[pa.RecordBatch]:
        return ()

    def busy(self) -> bool:
        return False

    def accepts_input(self) -> bool:
        return True

    def poll(self) -> Iterable[pa.RecordBatch]:
        return ()

    def finish(self) -> Iterable[pa.RecordBatch]:
        return ()

    def call(self, method: str, args: dict[str, Any]) -> Any:
        if method not in self.control_methods:
            raise ValueError(f"{type(self).__name__} has no control method {method!r}; it has {list(self.control_methods)}")
        return getattr(self, method)(**args)

    def live_stats(self) -> dict[str, Any] | None:
        return None

    def teardown(self) -> None:
        pass
